"""How long a job holds the GPU, swap included.

The policy simulator (`queueapp/simulation/`) and the llama-swap simulator
(`queueapp/upstream/simulator/`) both charge a swap; they import this one rule
so that a policy replayed on a virtual clock pays what the HTTP simulator
makes the live dispatcher pay.
"""

from __future__ import annotations


def occupancy_seconds(
    *, resident: str | None, model: str, seconds: float, swap_seconds: float
) -> float:
    """A job's own run, plus one flat cold load when its model is not the
    resident one (llama-swap stops the resident process and starts the
    requested one before the request runs)."""
    return seconds + (swap_seconds if resident != model else 0.0)
