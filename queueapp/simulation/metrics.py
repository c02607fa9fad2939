"""Figures from a run: waits per band and tier, the queueing-theory limit,
swaps, fairness within a band, starvation, and what each term did.

Cobham (1954): with non-preemptive priorities on one server and Poisson
arrivals, class k (1 = highest) waits on average

    W_k = W0 / ((1 - s_{k-1}) (1 - s_k)),   W0 = sum_i lambda_i E[S_i^2] / 2,

where s_k is the load of classes 1..k. W0 is the mean residual work of the
job in service, which no non-preemptive order can avoid; serving class 1
strictly first gives it W_1 = W0 / (1 - rho_1). Priorities only move waiting
between classes (Kleinrock's conservation law), which is why every band's
figures are shown, not only the top band's.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from queueapp.policy import TERMS
from queueapp.simulation.engine import Dispatch, Run
from queueapp.simulation.traces import Trace


@dataclass(frozen=True)
class WaitStats:
    count: int
    mean: float
    p95: float
    max: float


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def wait_stats(waits: Sequence[float]) -> WaitStats:
    if not waits:
        return WaitStats(0, math.nan, math.nan, math.nan)
    return WaitStats(len(waits), sum(waits) / len(waits), percentile(waits, 95), max(waits))


def jain_index(values: Iterable[float]) -> float:
    """Jain's fairness index (sum x)^2 / (n sum x^2): 1 when all are equal,
    1/n when one member has everything. Equal zeros count as fair."""
    xs = list(values)
    if not xs:
        return math.nan
    squares = sum(x * x for x in xs)
    if squares == 0:
        return 1.0
    return sum(xs) ** 2 / (len(xs) * squares)


@dataclass(frozen=True)
class ServiceClass:
    rate: float  # arrivals per second
    mean: float  # E[S], seconds
    second_moment: float  # E[S^2], seconds^2

    @property
    def load(self) -> float:
        return self.rate * self.mean

    @classmethod
    def of(cls, services: Sequence[float], horizon: float) -> ServiceClass:
        n = len(services)
        if n == 0:
            return cls(0.0, 0.0, 0.0)
        return cls(
            rate=n / horizon,
            mean=sum(services) / n,
            second_moment=sum(s * s for s in services) / n,
        )


def cobham_wait(classes: Sequence[ServiceClass], k: int = 0) -> float:
    """Mean wait in queue of class `k` (0 = highest) under non-preemptive
    priority; infinite when the load up to that class reaches 1."""
    residual = sum(c.rate * c.second_moment for c in classes) / 2
    above = sum(c.load for c in classes[:k])
    through = above + classes[k].load
    if through >= 1:
        return math.inf
    return residual / ((1 - above) * (1 - through))


def cobham_bound(services_by_band: dict[int, list[float]], horizon: float) -> float:
    """W_1 for the highest band, given every job's service time and the
    window the arrivals span."""
    bands = sorted(services_by_band, reverse=True)
    classes = [ServiceClass.of(services_by_band[band], horizon) for band in bands]
    return cobham_wait(classes, 0)


def _horizon(trace: Trace) -> float:
    if trace.duration_seconds > 0:
        return trace.duration_seconds
    return max((job.at or 0.0 for job in trace.jobs), default=0.0) or 1.0


def trace_bound(trace: Trace) -> float:
    """Cobham's W_1 for the trace's top band from its run times alone (no
    swap counted: a limit no policy that swaps can beat)."""
    services: dict[int, list[float]] = defaultdict(list)
    for job in trace.jobs:
        services[trace.band_of(job)].append(job.seconds)
    return cobham_bound(services, _horizon(trace))


def run_bound(run: Run) -> float:
    """Cobham's W_1 with the service times this run gave (swaps included):
    the best any priority order could do with the swaps this policy made."""
    services: dict[int, list[float]] = defaultdict(list)
    for dispatch in run.dispatches:
        services[dispatch.job.band].append(dispatch.finished_at - dispatch.started_at)
    return cobham_bound(services, _horizon(run.trace))


def fair_waits(dispatches: Sequence[Dispatch]) -> list[tuple[Dispatch, float]]:
    """Each job's wait counted from the later of its submission and the end of
    the same member's previous job in the band: the time other members' jobs
    (or other bands) held the GPU, not the member's own backlog. Jain's index
    over these is 1 when members take turns, however long their backlogs."""
    last_end: dict[tuple[int, int], float] = {}
    waits = []
    for dispatch in sorted(dispatches, key=lambda d: d.started_at):
        lane = (dispatch.job.member_id, dispatch.job.band)
        since = max(dispatch.job.submitted_at, last_end.get(lane, -math.inf))
        waits.append((dispatch, max(0.0, dispatch.started_at - since)))
        last_end[lane] = dispatch.finished_at
    return waits


@dataclass(frozen=True)
class ChainResult:
    units: int
    done: int
    first_submitted: float
    finished_at: float

    @property
    def completion_seconds(self) -> float:
        return self.finished_at - self.first_submitted


@dataclass
class Summary:
    trace: str
    policy: str
    jobs: int
    top_band: int
    bottom_band: int
    bands: dict[int, WaitStats]
    tiers: dict[tuple[int, str], WaitStats]
    bound: float
    bound_with_swaps: float
    swaps: int
    swap_seconds: float
    jain: dict[int, tuple[float, int]]  # band -> (index, members)
    longest_wait: float
    longest_wait_job: str
    chains: dict[str, ChainResult]
    batch_completion: float  # last start+run of the bottom band, from its first submission
    changed_by: dict[str, int] = field(default_factory=dict)
    changed_by_band: dict[int, dict[str, int]] = field(default_factory=dict)
    finished_at: float = 0.0
    tier_order: list[str] = field(default_factory=list)
    # Several GPUs: each GPU's share of the run busy (swaps included), the
    # jobs no GPU would take, and the dispatches where the ranking's first
    # job was left to another idle GPU (the placement rule).
    gpu_busy: dict[str, float] = field(default_factory=dict)
    never_started: int = 0
    placements: int = 0
    borrowed: int = 0  # dispatches lent past the member's running limit
    # Callers (callers.py): jobs expired in the queue, per band; callers who
    # left mid-run; GPU seconds drained after they left.
    expired: dict[int, int] = field(default_factory=dict)
    callers_left: int = 0
    drained_seconds: float = 0.0
    callers: str = ""
    # Parallel slots: the run's setting, the slots withheld so that a GPU
    # drains for another model, and the most jobs one GPU ran at once.
    parallel: dict[str, int] = field(default_factory=dict)
    drains: int = 0
    most_in_flight: int = 1

    @property
    def interactive(self) -> WaitStats:
        return self.bands[self.top_band]

    @property
    def vs_bound(self) -> float:
        return self.interactive.mean / self.bound if self.bound else math.nan


def summarize(run: Run) -> Summary:
    dispatches = run.dispatches
    trace = run.trace
    by_band: dict[int, list[float]] = defaultdict(list)
    by_tier: dict[tuple[int, str], list[float]] = defaultdict(list)
    for dispatch in dispatches:
        by_band[dispatch.job.band].append(dispatch.wait)
        by_tier[(dispatch.job.band, dispatch.job.tier)].append(dispatch.wait)
    member_fair: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for dispatch, wait in fair_waits(dispatches):
        member_fair[dispatch.job.band][dispatch.job.job.member].append(wait)
    jain = {
        band: (jain_index(sum(w) / len(w) for w in members.values()), len(members))
        for band, members in member_fair.items()
    }
    chains: dict[str, list[Dispatch]] = defaultdict(list)
    for dispatch in dispatches:
        if dispatch.job.job.chain:
            chains[dispatch.job.job.chain].append(dispatch)
    units: defaultdict[str, int] = defaultdict(int)
    for job in trace.jobs:
        if job.chain:
            units[job.chain] += 1
    bottom = min(by_band) if by_band else 0
    bottom_jobs = [d for d in dispatches if d.job.band == bottom]
    changed, changed_band = _terms_that_changed_the_order(dispatches)
    longest = max(dispatches, key=lambda d: d.wait) if dispatches else None
    return Summary(
        trace=trace.name,
        policy=run.policy,
        jobs=len(dispatches),
        top_band=max(by_band) if by_band else 0,
        bottom_band=bottom,
        bands={band: wait_stats(waits) for band, waits in sorted(by_band.items(), reverse=True)},
        tiers={key: wait_stats(waits) for key, waits in sorted(by_tier.items(), reverse=True)},
        bound=trace_bound(trace),
        bound_with_swaps=run_bound(run),
        swaps=sum(1 for d in dispatches if d.swapped),
        swap_seconds=sum(trace.swap_seconds for d in dispatches if d.swapped),
        jain=dict(sorted(jain.items(), reverse=True)),
        longest_wait=longest.wait if longest else 0.0,
        longest_wait_job=longest.job.job.id if longest else "",
        chains={
            name: ChainResult(
                units=units[name],
                done=len(done),
                first_submitted=min(d.job.submitted_at for d in done),
                finished_at=max(d.finished_at for d in done),
            )
            for name, done in chains.items()
        },
        batch_completion=(
            max(d.finished_at for d in bottom_jobs) - min(d.job.submitted_at for d in bottom_jobs)
            if bottom_jobs
            else 0.0
        ),
        changed_by=changed,
        changed_by_band=changed_band,
        finished_at=max((d.finished_at for d in dispatches), default=0.0),
        tier_order=sorted(trace.tiers, key=lambda name: trace.tiers[name].bonus),
        gpu_busy=gpu_busy(run),
        never_started=len(run.never_started),
        placements=sum(1 for d in dispatches if d.placed),
        borrowed=sum(1 for d in dispatches if d.borrowed),
        expired=dict(
            sorted(Counter(queued.band for queued, _ in run.expired).items(), reverse=True)
        ),
        callers_left=sum(1 for d in dispatches if d.caller_left_at is not None),
        drained_seconds=sum(d.drained_seconds for d in dispatches),
        callers=run.callers,
        parallel=dict(run.parallel),
        drains=len(run.drains),
        most_in_flight=max((d.in_flight for d in dispatches), default=1),
    )


def _terms_that_changed_the_order(
    dispatches: list[Dispatch],
) -> tuple[dict[str, int], dict[int, dict[str, int]]]:
    """How many dispatches each term changed, in all and per band."""
    changed: dict[str, int] = dict.fromkeys(TERMS, 0)
    changed_band: dict[int, dict[str, int]] = defaultdict(lambda: dict.fromkeys(TERMS, 0))
    for dispatch in dispatches:
        for term in dispatch.changed_by:
            # `shortness` is a term only where shorter-first is on: counted, not tabled.
            changed[term] = changed.get(term, 0) + 1
            band_counts = changed_band[dispatch.job.band]
            band_counts[term] = band_counts.get(term, 0) + 1
    return changed, {band: dict(counts) for band, counts in changed_band.items()}


def gpu_busy(run: Run) -> dict[str, float]:
    """Each GPU's busy time over the run, from the first dispatch allowed to
    the last end; empty for a one-GPU run. Jobs side by side in slots count
    once: a GPU is busy while anything is in flight."""
    if len(run.gpus) < 2 or not run.dispatches:
        return {}
    start = run.trace.dispatch_from
    span = max(d.finished_at for d in run.dispatches) - start
    held: dict[str, float] = dict.fromkeys(run.gpus, 0.0)
    covered: dict[str, float] = {}  # each GPU's latest end counted so far
    for dispatch in sorted(run.dispatches, key=lambda d: d.started_at):
        begin = max(dispatch.started_at, covered.get(dispatch.gpu, dispatch.started_at))
        if dispatch.finished_at > begin:
            held[dispatch.gpu] += dispatch.finished_at - begin
            covered[dispatch.gpu] = dispatch.finished_at
    return {name: seconds / span if span > 0 else 0.0 for name, seconds in held.items()}


def residual_by_kind(trace: Trace) -> dict[str, float]:
    """Each kind's share of W0 = sum lambda E[S^2] / 2 (seconds): the mean
    residual of the job already running when a job arrives."""
    horizon = _horizon(trace)
    shares: dict[str, float] = defaultdict(float)
    for job in trace.jobs:
        shares[job.kind or job.model] += job.seconds**2 / (2 * horizon)
    return dict(sorted(shares.items(), key=lambda item: -item[1]))
