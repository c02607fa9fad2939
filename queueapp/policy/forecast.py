"""Playing the queue forward: positions and estimated start times.

The same `best` the dispatcher relies on decides each step, on a virtual
clock: aging advances, the resident model changes after each job, a dispatch
restarts the aging of the member's other jobs in that band (the lane clock),
and each queue line (a member's jobs of one band and model) goes in
submission order, exactly as at a real dispatch (queueapp/lanes.py).
Durations come from what finished jobs took (queueapp/eta.py); the results
are estimates.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from queueapp.policy.score import Candidate, PolicySettings, best


@dataclass(frozen=True)
class Forecast:
    job_id: int
    position: int  # 1 = next to start
    estimated_start: float  # unix seconds
    estimated_seconds: float  # its own run time, swap included


def _line_order(candidate: Candidate) -> tuple[float, int]:
    return (candidate.submitted_at, candidate.job_id)


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
    until_job_id: int | None = None,
    more_in_line: Callable[[Candidate], list[Candidate]] | None = None,
) -> list[Forecast]:
    """Dispatch order and start times if nothing new arrives.

    Each queue line's first candidate is its head and keeps its
    `eligible_at`; the others age from the later of their submission and the
    last dispatch in their lane. `gpu_free_at` is when the running job should end
    (now when idle). The play stops after `stop_after` jobs, once
    `until_job_id` is placed, or when the queue is empty. `more_in_line(last)`
    may return the line's jobs after `last` when the given ones run out.
    """
    lines: dict[tuple[int, int, str], deque[Candidate]] = {}
    for candidate in sorted(candidates, key=_line_order):
        lines.setdefault(candidate.line, deque()).append(candidate)
    heads = {line: queue.popleft() for line, queue in lines.items()}
    clock = max(now, gpu_free_at)
    resident = resident_model
    order: list[Forecast] = []
    while heads and (stop_after is None or len(order) < stop_after):
        winner = best(heads.values(), now=clock, resident_model=resident, settings=settings)
        chosen = winner.candidate
        seconds = run_seconds(chosen)
        if chosen.model != resident:
            seconds += swap_seconds(chosen.model)
        order.append(Forecast(chosen.job_id, len(order) + 1, clock, seconds))
        if chosen.job_id == until_job_id:
            break
        for line, head in heads.items():
            if head.lane == chosen.lane and head.eligible_at < clock:
                heads[line] = replace(head, eligible_at=clock)
        waiting = lines[chosen.line]
        if not waiting and more_in_line is not None:
            waiting.extend(more_in_line(chosen))
        if waiting:
            following = waiting.popleft()
            heads[chosen.line] = replace(following, eligible_at=max(following.submitted_at, clock))
        else:
            del heads[chosen.line]
        resident = chosen.model
        clock += seconds
    return order
