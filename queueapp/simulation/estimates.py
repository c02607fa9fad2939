"""What the replay on several GPUs estimates of a job's run, learned as it goes.

Two estimates, side by side, both learned online from the runs the replay
has finished (alone on their GPU, without swap), as the live system learns
them (queueapp/durations.py, services/run_stats.py):

- `MODEL_MEAN`: the model's decayed mean run, what a job's run was taken as
  before sizes were read;
- `SIZE`: the job's size (`TraceJob.size`, read from its body by
  queueapp/policy/request_size.py) on its model and path's fitted line
  (queueapp/policy/size_fit.py), through `expected_run`, so before the
  line has runs enough it is the model's mean, as live.

At each submission (with `forecasts` on) the forecast the live ETA plays
(`play_forward`, queueapp/policy/forecast.py) is played once per estimate,
from what the replay knows then: the queue, each GPU's running jobs and
when the estimate says they end. Its start is the job's ETA, kept to be
compared with the start the replay gives it (`eta_errors`); a bounded job
is also judged by each admission rule (`ADMISSION_RULES`), and the verdict
compared with whether it did start in time (`refusal_counts`). The
verdicts do not act: every rule is judged on the same run (a refusal
would change the queue the next forecasts read, and the rules would no
longer be compared on one run).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from queueapp.policy.expected import (
    DEFAULT_RUN_SECONDS,
    Basis,
    Expected,
    decayed_mean,
    expected_run,
)
from queueapp.policy.facts import ClusterFacts
from queueapp.policy.forecast import Forecast, play_forward
from queueapp.policy.forecast_timeline import ForecastGpu, InFlight
from queueapp.policy.score import Candidate, PolicySettings
from queueapp.policy.size_fit import SizeFitSums, run_so_far_median, spread_of
from queueapp.policy.wait_bound import RunAhead, refuses_for_bound, run_ahead
from queueapp.simulation.engine import Dispatch, QueuedJob, Run, SubmittedForecast
from queueapp.simulation.traces import TraceJob

# The replay (cluster._Replay) and its view are typed `Any` here: cluster.py
# calls this module, and the layer test forbids an import cycle, even one
# for types only.

MODEL_MEAN = "per-model mean"
SIZE = "size-aware"
# Each job's own run time, known in advance: no estimate can do better, so
# what error is left is the arrivals after the submission that go first.
EXACT = "exact run times"
ESTIMATES = (MODEL_MEAN, SIZE, EXACT)
# Admission rules judged on each bounded job: (name, estimate, rule).
# `today`: refuse when the forecast start is past the bound; `p90 rule`:
# refuse only when even the lucky start is (wait_bound.refuses_for_bound).
TODAY = "today: per-model mean, forecast start"
SIZE_P50 = "size-aware, forecast start"
SIZE_P90 = "size-aware, p90 rule"
ADMISSION_RULES = ((TODAY, MODEL_MEAN, False), (SIZE_P50, SIZE, False), (SIZE_P90, SIZE, True))


@dataclass
class Learned:
    """Each model's finished runs, plain mean: the reservations' and the
    borrowing guard's expected run time, as the replay has always used it."""

    runs: Counter[str] = field(default_factory=Counter)
    total: dict[str, float] = field(default_factory=dict)
    mean: dict[str, float] = field(default_factory=dict)

    def finished(self, model: str, seconds: float) -> None:
        self.runs[model] += 1
        self.total[model] = self.total.get(model, 0.0) + seconds
        self.mean[model] = self.total[model] / self.runs[model]


@dataclass
class RunEstimates:
    """The decayed mean per model and the size line per model and path,
    from the runs alone finished so far."""

    mean: dict[str, float] = field(default_factory=dict)
    sums: dict[tuple[str, str], SizeFitSums] = field(default_factory=dict)

    def finished(self, job: TraceJob, seconds: float) -> None:
        self.mean[job.model] = decayed_mean(self.mean.get(job.model), seconds)
        if job.size is not None:
            key = (job.model, job.path)
            self.sums[key] = self.sums.get(key, SizeFitSums()).with_run(job.size, seconds)

    def expected(self, job: TraceJob, estimate: str) -> Expected:
        if estimate == EXACT:
            return Expected(job.seconds, job.seconds, Basis.SIZE, job.size)
        sized = estimate == SIZE and job.size is not None
        sums = self.sums.get((job.model, job.path)) if sized else None
        return expected_run(
            size=job.size if sized else None,
            line=sums.line() if sums is not None else None,
            model_mean=self.mean.get(job.model),
            typical_seconds=None,
        )

    def p50(self, job: TraceJob, estimate: str) -> float:
        return self.expected(job, estimate).p50 or DEFAULT_RUN_SECONDS

    def spread(self, job: TraceJob, estimate: str) -> tuple[float, float | None]:
        """(p50, p90) of the job's run, the default before anything is learned."""
        expected = self.expected(job, estimate)
        if expected.p50 is None:
            return DEFAULT_RUN_SECONDS, None
        return expected.p50, expected.p90


@runtime_checkable
class ForecastingPolicy(Protocol):
    """gpusched on several GPUs, as the forecast needs it."""

    settings: PolicySettings

    def queued_candidates(self, queue: Sequence[QueuedJob]) -> list[Candidate]: ...

    def facts_for(self, queue: Sequence[QueuedJob], cluster: Any) -> ClusterFacts: ...


def forecast_submission(replay: Any, queued: QueuedJob, *, now: float) -> SubmittedForecast:
    """`queued`, just submitted: its start as each estimate forecasts it,
    and each admission rule's verdict when it bounds its wait."""
    policy = replay.policy
    if not isinstance(policy, ForecastingPolicy):
        raise ValueError(f"{policy.name} does not forecast: only gpusched's setups do")
    cluster = replay.view()
    facts = policy.facts_for(replay.queue, cluster)
    candidates = policy.queued_candidates(replay.queue)
    by_id = {q.job_id: q for q in replay.queue}
    starts: dict[str, float | None] = {}
    aheads: dict[str, list[RunAhead]] = {}
    for estimate in ESTIMATES:
        order, gpus = _play(replay, policy, candidates, facts, by_id, estimate, now, queued)
        mine = next((f for f in order if f.job_id == queued.job_id), None)
        starts[estimate] = None if mine is None else mine.estimated_start
        if mine is not None:
            aheads[estimate] = _runs_ahead(replay, mine, order, gpus, by_id, estimate, now)
    bound = replay.callers.bound_of(queued.job)
    refused: dict[str, bool] = {}
    if bound is not None:
        for rule, estimate, p90_rule in ADMISSION_RULES:
            start = starts[estimate]
            start_in = None if start is None else start - now
            ahead = aheads.get(estimate, []) if p90_rule else []
            refused[rule] = refuses_for_bound(start_in=start_in, ahead=ahead, bound=bound)
    return SubmittedForecast(queued, bound, starts, refused)


def _play(
    replay: Any,
    policy: ForecastingPolicy,
    candidates: list[Candidate],
    facts: ClusterFacts,
    by_id: Mapping[int, QueuedJob],
    estimate: str,
    now: float,
    queued: QueuedJob,
) -> tuple[list[Forecast], dict[str, list[RunAhead]]]:
    """The forecast's order with `estimate`'s runs, and per GPU the rest of
    each of its running jobs (for the p90 rule)."""
    learned = replay.estimates
    gpus: list[ForecastGpu] = []
    running: dict[str, list[RunAhead]] = {}
    running_until: dict[int, list[tuple[float, str]]] = {}
    for view, gpu in zip(replay.view().gpus, replay.fleet, strict=True):
        flights = []
        for dispatch in gpu.in_flight.values():
            p50, p90 = learned.spread(dispatch.job.job, estimate)
            start = dispatch.started_at + (replay.trace.swap_seconds if dispatch.swapped else 0.0)
            # Sized, as the live forecast: the median of runs that lasted this
            # long, by the spread its line measured (eta._expected_end); else,
            # as before, a job past its estimate ends now.
            measured = learned.expected(dispatch.job.job, estimate).basis is Basis.SIZE
            run = (
                run_so_far_median(median=p50, spread=spread_of(p50, p90), elapsed=now - start)
                if estimate == SIZE and measured
                else p50
            )
            end = max(now, start + run)
            flights.append(InFlight(dispatch.job.model, end))
            running.setdefault(view.name, []).append(run_ahead(ends_in=end - now, p50=p50, p90=p90))
            running_until.setdefault(dispatch.job.member_id, []).append((end, view.name))
        reservation = view.reservation
        gpus.append(
            ForecastGpu(
                view.name,
                max([now, *(flight.ends_at for flight in flights)]),
                view.resident,
                min_band=reservation.min_band if reservation else None,
                short_models=(
                    reservation.short_models(replay.learned.mean) if reservation else None
                ),
                in_flight=tuple(flights),
                parallel=dict(replay.slots),
            )
        )
    order = play_forward(
        candidates,
        now=now,
        gpu_free_at=now,
        resident_model=None,
        settings=policy.settings,
        run_seconds=lambda candidate: learned.p50(by_id[candidate.job_id].job, estimate),
        swap_seconds=lambda model: replay.trace.swap_seconds,
        until_job_id=queued.job_id,
        gpus=gpus,
        running_limit=facts.running_limit,
        running_until=running_until,
        borrowing=facts.borrowing,
    )
    return order, running


def _runs_ahead(
    replay: Any,
    mine: Forecast,
    order: Sequence[Forecast],
    running: Mapping[str, list[RunAhead]],
    by_id: Mapping[int, QueuedJob],
    estimate: str,
    now: float,
) -> list[RunAhead]:
    """The runs the forecast puts before `mine` on its GPU, the running
    ones included, each with its spread."""
    gpu = mine.gpu or ""
    ahead = list(running.get(gpu, []))
    for played in order:
        if played.job_id == mine.job_id:
            break
        if (played.gpu or "") != gpu:
            continue
        p50, p90 = replay.estimates.spread(by_id[played.job_id].job, estimate)
        ahead.append(run_ahead(ends_in=played.estimated_seconds, p50=p50, p90=p90))
    return ahead


# -- the figures -------------------------------------------------------------------------


@dataclass(frozen=True)
class EtaError:
    """Mean absolute error of the forecast start, over the jobs it placed."""

    mean_abs: float
    jobs: int
    unplaced: int  # jobs the forecast did not place at their submission


def eta_errors(run: Run, *, band: int | None = None) -> dict[str, EtaError]:
    """Per estimate, |forecast start at submission − actual start| over the
    jobs of `band` (the run's top band by default) that started."""
    started = {d.job.job_id: d for d in run.dispatches}
    top = band if band is not None else max((f.job.band for f in run.forecasts), default=0)
    errors: dict[str, EtaError] = {}
    for estimate in ESTIMATES:
        gaps, unplaced = [], 0
        for forecast in run.forecasts:
            dispatch = started.get(forecast.job.job_id)
            if forecast.job.band != top or dispatch is None:
                continue
            start = forecast.starts.get(estimate)
            if start is None:
                unplaced += 1
                continue
            gaps.append(abs(start - dispatch.started_at))
        mean = sum(gaps) / len(gaps) if gaps else math.nan
        errors[estimate] = EtaError(mean, len(gaps), unplaced)
    return errors


@dataclass(frozen=True)
class RefusalCounts:
    """One admission rule on a run's bounded jobs."""

    bounded: int
    refused: int
    refused_in_time: int  # refused, yet started within the bound: a broken promise
    admitted_missed: int  # admitted, and did not start within the bound

    @property
    def kept(self) -> float:
        """The share of refusals that kept their promise."""
        return 1 - self.refused_in_time / self.refused if self.refused else math.nan


def refusal_counts(run: Run) -> dict[str, RefusalCounts]:
    started = {d.job.job_id: d for d in run.dispatches}
    bounded = [f for f in run.forecasts if f.bound is not None]
    counts: dict[str, RefusalCounts] = {}
    for rule, _, _ in ADMISSION_RULES:
        refused = in_time = missed = 0
        for forecast in bounded:
            assert forecast.bound is not None
            dispatch = started.get(forecast.job.job_id)
            made_it = _in_time(dispatch, forecast.job, forecast.bound)
            if forecast.refused[rule]:
                refused += 1
                in_time += made_it
            else:
                missed += not made_it
        counts[rule] = RefusalCounts(len(bounded), refused, in_time, missed)
    return counts


def _in_time(dispatch: Dispatch | None, queued: QueuedJob, bound: float) -> bool:
    return dispatch is not None and dispatch.started_at <= queued.submitted_at + bound
