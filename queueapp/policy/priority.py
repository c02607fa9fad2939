"""What a caller asks for: the X-LlamaSwap-Priority header, a `priority`
in the body, the band a path gets when the call names none, and the tier caps.

Why the header wins over the body: the header is the interface gpusched was
built around (DESIGN: "the number is the interface"), set by whoever runs the
client, while a body is often written by a library on the caller's behalf;
a caller that sets both meant the header. Why a body's `priority` is cut out
of the original bytes rather than re-serialised: llama-swap, and the server
behind it, then get exactly the bytes they would have got without gpusched,
spacing, key order and number spelling included (`body_without_priority`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

# `background` and `batch` are one band: engines that name their lowest
# priority `background` are understood as they are.
BAND_ALIASES: dict[str, int] = {"interactive": 100, "normal": 0, "batch": -100, "background": -100}

# Stored as a 64-bit integer; a larger request is saturated, then capped.
PRIORITY_LIMIT = 2**63 - 1

# The field of a JSON body (front door) or of a REST submission that asks for a band.
BODY_FIELD = "priority"

# The band of a call that names none, by path (the policy's `priority_by_path`):
# speech that arrives late is a conversation that stalled.
DEFAULT_PRIORITY_BY_PATH: dict[str, int] = {
    "/v1/audio/speech": BAND_ALIASES["interactive"],
    "/v1/audio/transcriptions": BAND_ALIASES["interactive"],
}
MAX_PATH_LENGTH = 200


def default_priority_by_path() -> dict[str, int]:
    """The policy's `priority_by_path` until an operator changes it."""
    return dict(DEFAULT_PRIORITY_BY_PATH)


_INTEGER = re.compile(r"[+-]?[0-9]+")


def parse_priority_header(raw: str | None) -> int:
    """The requested priority: a signed decimal integer or an alias.

    Surrounding spaces and a leading `+` are allowed, aliases are
    case-insensitive; anything else (absent, `abc`, `1.5`) means 0. Never
    raises.
    """
    if raw is None:
        return 0
    text = raw.strip()
    if _INTEGER.fullmatch(text):
        # Bound the digits first: int() of a 100k-digit string is slow on purpose.
        if len(text.lstrip("+-")) > 19:
            return -PRIORITY_LIMIT if text.startswith("-") else PRIORITY_LIMIT
        return max(-PRIORITY_LIMIT, min(PRIORITY_LIMIT, int(text)))
    return BAND_ALIASES.get(text.lower(), 0)


def parse_priority_value(value: Any) -> int:
    """A `priority` from a JSON body, by the header's rules: an integer or
    an alias, as a JSON number or string; anything else (1.5, true, a list)
    means 0. Never raises."""
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return max(-PRIORITY_LIMIT, min(PRIORITY_LIMIT, value))
    if isinstance(value, str):
        return parse_priority_header(value)
    return 0


def requested_priority(*, header: str | None, body: Any = None, default: int = 0) -> int:
    """The band a call asks for: the header's when it has one, else the
    body's `priority` (None or JSON null: not given), else `default` (the
    path's band, `band_for_path`)."""
    if header is not None:
        return parse_priority_header(header)
    if body is not None:
        return parse_priority_value(body)
    return default


def band_for_path(path: str, by_path: Mapping[str, Any]) -> int:
    """The band a call on `path` gets when it names none: the policy's
    `priority_by_path` entry, else normal (0)."""
    band = by_path.get(path)
    return band if isinstance(band, int) and not isinstance(band, bool) else 0


class PathBandsInvalid(ValueError):
    """A `priority_by_path` that is not {path: band}."""


def path_bands(value: Any, *, known_paths: tuple[str, ...] | None = None) -> dict[str, int]:
    """The policy's `priority_by_path`, validated: {path: band}, a band an
    integer or an alias (stored as its integer). With `known_paths`, a path
    gpusched does not serve is refused, so a typo is not a silent no-op.
    Raises PathBandsInvalid naming the entry at fault."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise PathBandsInvalid('an object {path: band}, e.g. {"/v1/audio/speech": "interactive"}')
    bands: dict[str, int] = {}
    for path, band in value.items():
        if not isinstance(path, str) or not path.startswith("/") or len(path) > MAX_PATH_LENGTH:
            raise PathBandsInvalid(f"{str(path)[:40]!r} is not a path (it starts with /)")
        if known_paths is not None and path not in known_paths:
            raise PathBandsInvalid(
                f"{path[:60]!r} is not a path gpusched serves; use one of {', '.join(known_paths)}"
            )
        bands[path] = _band_of(path, band)
    return bands


def _band_of(path: str, band: Any) -> int:
    if isinstance(band, int) and not isinstance(band, bool):
        if abs(band) <= PRIORITY_LIMIT:
            return band
    elif isinstance(band, str):
        text = band.strip()
        if text.lower() in BAND_ALIASES:
            return BAND_ALIASES[text.lower()]
        if _INTEGER.fullmatch(text) and len(text.lstrip("+-")) <= 18:
            return int(text)
    aliases = ", ".join(BAND_ALIASES)
    raise PathBandsInvalid(
        f"{path}: {str(band)[:40]!r} is not a band (an integer or one of {aliases})"
    )


def body_without_priority(raw: bytes) -> bytes:
    """`raw`, a JSON object's bytes, with every top-level `priority` member
    cut out and every other byte as it came. A body this cannot read as
    UTF-8 JSON object text is written again, compactly, in its key order."""
    try:
        text = raw.decode("utf-8")
        members = _member_spans(text)
    except (UnicodeDecodeError, ValueError, RecursionError):
        parsed = json.loads(raw)
        rest = {key: value for key, value in parsed.items() if key != BODY_FIELD}
        return json.dumps(rest, ensure_ascii=False, separators=(",", ":")).encode()
    if all(member.key != BODY_FIELD for member in members):
        return raw
    # What opens the object, each kept member with the separator that
    # followed it, then what closes the object after the last member.
    pieces = [text[: members[0].start]]
    kept = [index for index, member in enumerate(members) if member.key != BODY_FIELD]
    for number, index in enumerate(kept):
        member = members[index]
        pieces.append(text[member.start : member.end])
        if number + 1 < len(kept):
            pieces.append(text[member.end : members[index + 1].start])
    pieces.append(text[members[-1].end :])
    return "".join(pieces).encode()


class _Member:
    """Where one member of the top-level object lies: from its key's quote
    to the end of its value."""

    __slots__ = ("end", "key", "start")

    def __init__(self, key: str, start: int, end: int) -> None:
        self.key, self.start, self.end = key, start, end


_SPACE = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


def _member_spans(text: str) -> list[_Member]:
    """The top-level object's members, in order; ValueError unless `text`
    is one JSON object."""
    at = _SPACE.match(text, 0).end()  # type: ignore[union-attr]  # matches the empty string
    if text[at : at + 1] != "{":
        raise ValueError("not a JSON object")
    at = _SPACE.match(text, at + 1).end()  # type: ignore[union-attr]
    members: list[_Member] = []
    if text[at : at + 1] == "}":
        at += 1
    else:
        while True:
            if text[at : at + 1] != '"':
                raise ValueError("a key was expected")
            start = at
            key, at = _DECODER.raw_decode(text, at)
            at = _SPACE.match(text, at).end()  # type: ignore[union-attr]
            if text[at : at + 1] != ":":
                raise ValueError("':' was expected")
            at = _SPACE.match(text, at + 1).end()  # type: ignore[union-attr]
            _, at = _DECODER.raw_decode(text, at)
            members.append(_Member(key, start, at))
            at = _SPACE.match(text, at).end()  # type: ignore[union-attr]
            if text[at : at + 1] == ",":
                at = _SPACE.match(text, at + 1).end()  # type: ignore[union-attr]
                continue
            if text[at : at + 1] != "}":
                raise ValueError("',' or '}' was expected")
            at += 1
            break
    if text[_SPACE.match(text, at).end() :]:  # type: ignore[union-attr]
        raise ValueError("text after the object")
    return members


def clamp_priority(requested: int, *, floor: int, cap: int) -> int:
    """The applied priority: the request clamped into the tier's [floor, cap]."""
    return max(floor, min(cap, requested))


# A preload's band when its caller names none (background): a job whose
# model is loaded already goes ahead of it.
PRELOAD_PRIORITY = -100
