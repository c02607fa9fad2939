"""A discrete-event replay of a trace through one policy, on a virtual clock.

One GPU, one job at a time, never interrupted. When the GPU frees (or a job
arrives at an idle GPU) the policy chooses among the jobs queued by then; the
job holds the GPU for its run plus a swap when its model is not the resident
one, charged by the rule the built-in llama-swap simulator uses too
(`queueapp.policy.occupancy_seconds`). The next decision follows at once:
the live dispatcher's gap between two jobs is milliseconds
(docs/benchmarks.md). Job ids are given in submission order, as the
database's sequence gives them, so ties go the same way as live.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from queueapp.policy.occupancy import occupancy_seconds
from queueapp.simulation.traces import Trace, TraceJob


@dataclass(frozen=True)
class QueuedJob:
    job_id: int  # submission order, from 1
    job: TraceJob
    member_id: int
    band: int  # the applied priority, after the tier's cap and floor
    tier: str
    tier_bonus: float
    submitted_at: float

    @property
    def model(self) -> str:
        return self.job.model


@dataclass(frozen=True)
class Choice:
    job: QueuedJob
    # Terms without which another job would have gone first (gpusched only).
    changed_by: frozenset[str] = frozenset()


class SchedulingPolicy(Protocol):
    """Chooses the next job when the GPU frees; told each dispatch."""

    name: str

    def choose(self, queue: Sequence[QueuedJob], *, now: float, resident: str | None) -> Choice:
        """The job to start now; `queue` is not empty."""
        ...

    def dispatched(self, chosen: QueuedJob, *, at: float) -> None:
        """`chosen` started at `at` (a policy with memory updates it here)."""
        ...


@dataclass(frozen=True)
class Dispatch:
    job: QueuedJob
    started_at: float
    finished_at: float
    swapped: bool
    changed_by: frozenset[str]

    @property
    def wait(self) -> float:
        return self.started_at - self.job.submitted_at


@dataclass
class Run:
    trace: Trace
    policy: str
    dispatches: list[Dispatch] = field(default_factory=list)

    @property
    def order(self) -> list[str]:
        """Trace ids in the order the GPU started them."""
        return [dispatch.job.job.id for dispatch in self.dispatches]


def simulate(trace: Trace, policy: SchedulingPolicy) -> Run:
    member_ids = {name: n for n, name in enumerate(trace.members, 1)}
    followers: dict[str, list[TraceJob]] = defaultdict(list)
    arrivals: list[tuple[float, int, TraceJob]] = []
    for position, job in enumerate(trace.jobs):
        if job.at is not None:
            arrivals.append((job.at, position, job))
        else:
            followers[job.after or ""].append(job)
    heapq.heapify(arrivals)
    positions = {job.id: position for position, job in enumerate(trace.jobs)}

    queue: list[QueuedJob] = []
    run = Run(trace=trace, policy=policy.name)
    next_id = 1

    def admit(until: float) -> None:
        nonlocal next_id
        while arrivals and arrivals[0][0] <= until:
            at, _, job = heapq.heappop(arrivals)
            tier = trace.members[job.member]
            queue.append(
                QueuedJob(
                    job_id=next_id,
                    job=job,
                    member_id=member_ids[job.member],
                    band=trace.band_of(job),
                    tier=tier,
                    tier_bonus=trace.tiers[tier].bonus,
                    submitted_at=at,
                )
            )
            next_id += 1

    gpu_free_at = trace.dispatch_from
    resident = trace.initial_model
    while arrivals or queue:
        now = gpu_free_at
        admit(now)
        if not queue:
            now = max(now, arrivals[0][0])
            admit(now)
        choice = policy.choose(queue, now=now, resident=resident)
        chosen = choice.job
        queue.remove(chosen)
        policy.dispatched(chosen, at=now)
        held = occupancy_seconds(
            resident=resident,
            model=chosen.model,
            seconds=chosen.job.seconds,
            swap_seconds=trace.swap_seconds,
        )
        run.dispatches.append(
            Dispatch(chosen, now, now + held, chosen.model != resident, choice.changed_by)
        )
        for follower in followers.get(chosen.job.id, ()):
            heapq.heappush(
                arrivals, (now + held + follower.delay, positions[follower.id], follower)
            )
        resident = chosen.model
        gpu_free_at = now + held
    return run
