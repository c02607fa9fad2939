"""Durations, and what a GPU holds, as people read them."""

from __future__ import annotations

from typing import Any


def duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes:02d} m"
    if minutes:
        return f"{minutes} m {secs:02d} s"
    return f"{secs} s"


def resident_set(gpu: dict[str, Any]) -> str:
    """A GPU of `GET /api/gpus/` in one phrase, as the dashboard's card says
    it: its loaded models, each busy one with its running jobs, then what
    loads and the requests from elsewhere ("chat-small (2 running),
    embed-small · loading: image-xl")."""
    busy: dict[str, int] = gpu.get("busy_models") or {}
    loading: list[str] = gpu.get("loading_models") or []
    resident = gpu.get("resident_models")
    if resident is None:  # a gpusched from before resident sets
        resident = [gpu["resident_model"]] if gpu.get("resident_model") else []
    # A running job's model is loaded, whatever the last reading saw.
    loaded = sorted(set(resident) | (set(busy) - set(loading)))

    def named(model: str) -> str:
        return f"{model} ({busy[model]} running)" if busy.get(model) else model

    parts = [", ".join(named(model) for model in loaded)] if loaded else []
    if loading:
        parts.append("loading: " + ", ".join(named(model) for model in loading))
    foreign = gpu.get("foreign_in_flight") or 0
    if foreign:
        parts.append(f"{foreign} request{'' if foreign == 1 else 's'} from elsewhere")
    return " · ".join(parts)
