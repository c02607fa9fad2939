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


# A batching server (llama.cpp's `--parallel N`, vLLM) answers several
# requests of its loaded model at once; each one is slower the more share
# the GPU with it. The simulators model that as a flat factor per extra
# request in flight when it starts: four at once take 1.45x one alone
# each, about 2.8 times the throughput of one at a time.
BATCH_SLOWDOWN_PER_EXTRA_REQUEST = 0.15
# The most jobs of one model a GPU may be given at once (`parallel`).
MAX_PARALLEL = 64


def batched_seconds(seconds: float, in_flight: int) -> float:
    """A request's run time when `in_flight` requests (itself included) share
    the GPU as it starts."""
    return seconds * (1.0 + BATCH_SLOWDOWN_PER_EXTRA_REQUEST * max(0, in_flight - 1))
