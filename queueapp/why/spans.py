"""Stretches of time and the arithmetic on them: a span clipped to the wait,
the gaps nothing covered, and the cut of overlapping runs into pieces at every
start and end, so that each instant is counted once."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass
class Span:
    start: datetime
    end: datetime

    @property
    def seconds(self) -> float:
        return max(0.0, (self.end - self.start).total_seconds())


def clip(span: Span, window: Span) -> Span | None:
    start, end = max(span.start, window.start), min(span.end, window.end)
    return Span(start, end) if end > start else None


def cut_into_pieces(spans: list[Span]) -> list[tuple[Span, list[int]]]:
    """The stretches between consecutive starts and ends of `spans`, each
    with the indices of the spans running through it (none: left out)."""
    begins: dict[datetime, list[int]] = {}
    ends: dict[datetime, list[int]] = {}
    for index, span in enumerate(spans):
        begins.setdefault(span.start, []).append(index)
        ends.setdefault(span.end, []).append(index)
    edges = sorted(begins.keys() | ends.keys())
    running: set[int] = set()
    pieces = []
    for start, end in zip(edges, edges[1:], strict=False):
        running.difference_update(ends.get(start, []))
        running.update(begins.get(start, []))
        if running:
            pieces.append((Span(start, end), sorted(running)))
    return pieces


def uncovered(window: Span, covered: list[Span]) -> list[Span]:
    """The stretches of `window` that no span of `covered` covers. Each
    span is clipped to the window first: one that begins after the window
    ends must not open a gap past it."""
    gaps, cursor = [], window.start
    inside = [part for span in covered if (part := clip(span, window))]
    for span in sorted(inside, key=lambda s: s.start):
        if span.start > cursor:
            gaps.append(Span(cursor, span.start))
        cursor = max(cursor, span.end)
    if window.end > cursor:
        gaps.append(Span(cursor, window.end))
    return [gap for gap in gaps if gap.seconds > 0]


def tiles(pieces: list[Span], window: Span) -> bool:
    """Whether `pieces`, in order, cover `window` exactly: each begins where
    the last ended, from the window's start to its end (an empty window
    needs no piece)."""
    if not pieces:
        return window.seconds == 0
    edges_meet = all(a.end == b.start for a, b in zip(pieces, pieces[1:], strict=False))
    return edges_meet and pieces[0].start == window.start and pieces[-1].end == window.end
