"""A discrete-event replay of a trace through one policy, on a virtual clock.

One GPU (several: queueapp/simulation/cluster.py), one job at a time, never
interrupted. When the GPU frees (or a job arrives at an idle GPU) the policy
chooses among the jobs queued by then; the job holds the GPU for its run plus
a swap when its model is not the resident one, charged by the rule the
built-in llama-swap simulator uses too (`queueapp.policy.occupancy_seconds`).
The next decision follows at once: the live dispatcher's gap between two jobs
is milliseconds (docs/benchmarks.md). Job ids are given in submission order,
as the database's sequence gives them, so ties go the same way as live.
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
    # Its run's median as estimated at its submission, from its size
    # (queueapp/simulation/estimates.py); None where nothing estimates it.
    expected_seconds: float | None = None

    @property
    def model(self) -> str:
        return self.job.model


@dataclass(frozen=True)
class Choice:
    job: QueuedJob
    # Terms without which another job would have gone first (gpusched only).
    changed_by: frozenset[str] = frozenset()
    # The ranking's first job was left to another idle GPU that has its model
    # loaded (gpusched on several GPUs).
    placed: bool = False
    # Lent past its member's running limit: no other job could use the GPU
    # (gpusched on several GPUs, decide.Borrowing).
    borrowed: bool = False
    # With resident sets (cluster.py): `decide` said DRAIN, the job waits for
    # busy models it would unload; without them the replay tells by model.
    drains: bool = False


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
    gpu: str = ""  # its name when several GPUs run (queueapp/simulation/cluster.py)
    placed: bool = False  # see `Choice.placed`
    borrowed: bool = False  # see `Choice.borrowed`
    # Its caller left mid-run (callers.py): when, and how long the GPU went
    # on rendering for no one (`drain`; 0 when the request was closed).
    caller_left_at: float | None = None
    drained_seconds: float = 0.0
    # A model with parallel slots (cluster.py): the slot it took, from 0, and
    # the jobs on its GPU as it started, itself included (the decision's
    # `gpu_slot` and `in_flight`).
    slot: int = 0
    in_flight: int = 1

    @property
    def wait(self) -> float:
        return self.started_at - self.job.submitted_at


@dataclass(frozen=True)
class Drain:
    """A GPU with a free slot whose policy chose a job of another model: it
    gives no new slot until its `in_flight` jobs end, then chooses afresh."""

    gpu: str
    at: float
    chosen: QueuedJob
    in_flight: int
    dispatches_before: int  # the run's dispatches by then: its GPU's next start comes after


@dataclass(frozen=True)
class SubmittedForecast:
    """What was forecast of a job at its submission (estimates.py): its
    start by each estimate (None: not placed) and, when it bounds its
    wait, each admission rule's verdict (True: refused)."""

    job: QueuedJob
    bound: float | None
    starts: dict[str, float | None]
    refused: dict[str, bool]


@dataclass
class Run:
    trace: Trace
    policy: str
    dispatches: list[Dispatch] = field(default_factory=list)
    gpus: tuple[str, ...] = ("",)
    # Jobs no GPU would take (every GPU's reservation kept them out).
    never_started: list[QueuedJob] = field(default_factory=list)
    # Slots per model as the run was given them (absent: 1; cluster.py), and
    # each slot withheld so that a GPU drains for another model.
    parallel: dict[str, int] = field(default_factory=dict)
    drains: list[Drain] = field(default_factory=list)
    # Jobs whose wait bound passed while queued (callers.py), with when, and
    # the callers' setting in words.
    expired: list[tuple[QueuedJob, float]] = field(default_factory=list)
    callers: str = ""
    # With forecasts on (cluster.simulate_on_gpus): one per submission.
    forecasts: list[SubmittedForecast] = field(default_factory=list)

    @property
    def order(self) -> list[str]:
        """Trace ids in the order the GPU started them."""
        return [dispatch.job.job.id for dispatch in self.dispatches]


class Arrivals:
    """The trace's submissions as the clock reaches them: jobs with a time,
    and chain units released when the unit before them is dispatched (its end
    is known then). Ids are given in submission order, ties in file order."""

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        self.member_ids = {name: n for n, name in enumerate(trace.members, 1)}
        self.followers: dict[str, list[TraceJob]] = defaultdict(list)
        self.pending: list[tuple[float, int, TraceJob]] = []
        for position, job in enumerate(trace.jobs):
            if job.at is not None:
                self.pending.append((job.at, position, job))
            else:
                self.followers[job.after or ""].append(job)
        heapq.heapify(self.pending)
        self.positions = {job.id: position for position, job in enumerate(trace.jobs)}
        self.next_id = 1

    def __bool__(self) -> bool:
        return bool(self.pending)

    @property
    def next_at(self) -> float:
        return self.pending[0][0]

    def until(self, moment: float) -> list[QueuedJob]:
        """Every job submitted by `moment`, queued in submission order."""
        queued = []
        while self.pending and self.pending[0][0] <= moment:
            at, _, job = heapq.heappop(self.pending)
            tier = self.trace.members[job.member]
            queued.append(
                QueuedJob(
                    job_id=self.next_id,
                    job=job,
                    member_id=self.member_ids[job.member],
                    band=self.trace.band_of(job),
                    tier=tier,
                    tier_bonus=self.trace.tiers[tier].bonus,
                    submitted_at=at,
                )
            )
            self.next_id += 1
        return queued

    def release_after(self, job: TraceJob, *, finished_at: float) -> None:
        """`job` ends at `finished_at`: the units that follow it are submitted then."""
        for follower in self.followers.get(job.id, ()):
            heapq.heappush(
                self.pending,
                (finished_at + follower.delay, self.positions[follower.id], follower),
            )


def simulate(trace: Trace, policy: SchedulingPolicy) -> Run:
    arrivals = Arrivals(trace)
    queue: list[QueuedJob] = []
    run = Run(trace=trace, policy=policy.name)
    gpu_free_at = trace.dispatch_from
    resident = trace.initial_model
    while arrivals or queue:
        now = gpu_free_at
        queue.extend(arrivals.until(now))
        if not queue:
            now = max(now, arrivals.next_at)
            queue.extend(arrivals.until(now))
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
        arrivals.release_after(chosen.job, finished_at=now + held)
        resident = chosen.model
        gpu_free_at = now + held
    return run
