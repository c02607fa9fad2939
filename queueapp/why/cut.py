"""The wait cut once: the pieces of [submitted, started) in order, each
given to the parts it went to, and the parts' seconds read from them.

Every other module of `why` finds pieces (the holds shared out, the drains,
the gaps no dispatch covers); this one checks that they tile the wait, with
no gap and no overlap, and sums each part's seconds from its pieces, so the
parts add up to the measured wait by construction. A list that does not
(a piece given to no part, a hole or an overlap) is a defect: it is logged
with the job's id and the answer says so (`adds_up` false), never shown as
if it were whole.

The figures are then rounded so that the shown ones add up too: to the
millisecond for the API (`seconds`, `swap_seconds`: their sum is
`measured_wait_seconds`) and to the tenth for people (`shown_seconds`: their
sum is `shown_wait_seconds`, what the page, the CLI and the summary print),
each by the largest remainder.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from queueapp.why.kinds import PartKind
from queueapp.why.shared_time import Piece
from queueapp.why.spans import Span, tiles

logger = logging.getLogger(__name__)

# A piece's owners: a Hold or Drain object (by identity), or a gap's kind.
Owner = Hashable


@dataclass(frozen=True)
class Cut:
    """The parts with their final figures, the pieces as the answer shows
    them, and whether the pieces tiled the wait."""

    parts: list[dict[str, Any]]
    pieces: list[dict[str, Any]]
    adds_up: bool
    measured_seconds: float
    shown_wait_seconds: float


def piece_owners(piece: Piece) -> list[Owner]:
    """What a piece went to, as the keys its parts are found by."""
    if piece.drain is not None:
        return [id(piece.drain)]
    if piece.gap is not None:
        return [piece.gap]
    return [id(hold) for hold in piece.holds]


def cut_wait(
    *,
    job_id: int,
    window: Span,
    pieces: list[Piece],
    parts: list[dict[str, Any]],
    part_of: dict[Owner, int],
) -> Cut:
    """`parts`' seconds summed from `pieces` (each shared equally by its
    owners, `part_of` giving each owner's part), rounded; whether the
    pieces tile `window` and each has a part."""
    ordered = sorted(pieces, key=lambda piece: (piece.span.start, piece.span.end))
    whole = tiles([piece.span for piece in ordered], window)
    totals = [0.0] * len(parts)
    shown_pieces = []
    for piece in ordered:
        owners = [part_of.get(owner) for owner in piece_owners(piece)]
        indices = [index for index in owners if index is not None]
        if not indices or len(indices) != len(owners):
            whole = False
        for index in indices:
            totals[index] += piece.span.seconds / len(indices)
        shown_pieces.append(
            {
                "from": piece.span.start.isoformat(),
                "to": piece.span.end.isoformat(),
                "parts": indices,
            }
        )
    if not whole:
        logger.error(
            "why for job %s: its parts do not tile its wait of %.3f s "
            "(pieces %s); the answer says so",
            job_id,
            window.seconds,
            [(p["from"], p["to"], p["parts"]) for p in shown_pieces],
        )
    for part, total in zip(parts, totals, strict=True):
        if part["kind"] == PartKind.DISPATCHED_AHEAD:
            part["swap_seconds"] = min(part["swap_seconds"], total)
            part["seconds"] = total - part["swap_seconds"]
        else:
            part["seconds"] = total
    measured = _rounded_figures(parts, window.seconds)
    shown_wait = _shown_figures(parts, window.seconds)
    return Cut(parts, shown_pieces, whole, measured, shown_wait)


def _rounded_figures(parts: list[dict[str, Any]], wait: float) -> float:
    """Each part's `seconds` (and `swap_seconds`) to the millisecond, their
    sum the wait's; returns the wait so rounded."""
    keys = [(index, key) for index, part in enumerate(parts) for key in _figures(part)]
    rounded = largest_remainder([parts[i][key] for i, key in keys], wait, step=0.001)
    for (index, key), value in zip(keys, rounded, strict=True):
        parts[index][key] = value
    return _on_grid(wait, 0.001)


def _shown_figures(parts: list[dict[str, Any]], wait: float) -> float:
    """Each part's whole time (with its swap) to the tenth, as people read
    it (`shown_seconds`), their sum the wait's; returns the wait so shown."""
    whole = [sum(part[key] for key in _figures(part)) for part in parts]
    for part, shown in zip(parts, largest_remainder(whole, wait, step=0.1), strict=True):
        part["shown_seconds"] = shown
    return _on_grid(wait, 0.1)


def _figures(part: dict[str, Any]) -> list[str]:
    return ["seconds", "swap_seconds"] if "swap_seconds" in part else ["seconds"]


def _on_grid(value: float, step: float) -> float:
    units = 1 / step
    return round(value * units) / units


def largest_remainder(values: Sequence[float], total: float, *, step: float) -> list[float]:
    """`values` (each at least 0) rounded to multiples of `step` so that
    they add up to `total` rounded the same way: each rounded down, then the
    units left over go to the largest remainders (or, where they overshoot,
    come off the smallest)."""
    units = round(1 / step)
    scaled = [max(0.0, value) * units for value in values]
    floors = [math.floor(value + 1e-9) for value in scaled]
    left = round(total * units) - sum(floors)
    by_remainder = sorted(range(len(values)), key=lambda i: floors[i] - scaled[i])
    for index in by_remainder[: max(0, left)]:
        floors[index] += 1
    if left < 0:
        for index in reversed(by_remainder):
            if left == 0:
                break
            if floors[index] > 0:
                floors[index] -= 1
                left += 1
    return [floor / units for floor in floors]
