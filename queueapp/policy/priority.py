"""The X-LlamaSwap-Priority header and the tier caps."""

from __future__ import annotations

import re

BAND_ALIASES: dict[str, int] = {"interactive": 100, "normal": 0, "batch": -100}

# Stored as a 64-bit integer; a larger request is saturated, then capped.
PRIORITY_LIMIT = 2**63 - 1

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


def clamp_priority(requested: int, *, floor: int, cap: int) -> int:
    """The applied priority: the request clamped into the tier's [floor, cap]."""
    return max(floor, min(cap, requested))


# A preload's band when its caller names none (background): a job whose
# model is loaded already goes ahead of it.
PRELOAD_PRIORITY = -100
