"""Playing the queue forward: positions and estimated start times.

The same `rank` the dispatcher calls decides each step, on a virtual clock:
aging advances, the resident model changes after each job, and the lane clock
restarts for the dispatched job's member and band, exactly as at a real
dispatch. Durations come from what finished jobs took (see
queueapp/eta.py); they are estimates, and the answer says so.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from queueapp.policy.score import Candidate, PolicySettings, best


@dataclass(frozen=True)
class Forecast:
    job_id: int
    position: int  # 1 = next to start
    estimated_start: float  # unix seconds
    estimated_seconds: float  # its own run time, swap included


def play_forward(
    candidates: Iterable[Candidate],
    *,
    now: float,
    gpu_free_at: float,
    resident_model: str | None,
    settings: PolicySettings,
    run_seconds: Callable[[Candidate], float],
    swap_seconds: Callable[[str], float],
    stop_after: int | None = None,
) -> list[Forecast]:
    """Dispatch order and start times if nothing new arrives.

    `gpu_free_at` is when the running job should end (now when idle).
    `stop_after` bounds the work when only the first jobs matter.
    """
    pending = {c.job_id: c for c in candidates}
    clock = max(now, gpu_free_at)
    resident = resident_model
    order: list[Forecast] = []
    while pending and (stop_after is None or len(order) < stop_after):
        winner = best(pending.values(), now=clock, resident_model=resident, settings=settings)
        chosen = pending.pop(winner.candidate.job_id)
        seconds = run_seconds(chosen)
        if chosen.model != resident:
            seconds += swap_seconds(chosen.model)
        order.append(Forecast(chosen.job_id, len(order) + 1, clock, seconds))
        for job_id, other in pending.items():
            if other.lane == chosen.lane and other.eligible_at < clock:
                pending[job_id] = replace(other, eligible_at=clock)
        resident = chosen.model
        clock += seconds
    return order
