"""Estimates: what jobs take, learned from finished ones, and when a queued job starts.

Durations are decayed averages per (model, path) and concurrency level (how
many jobs shared the GPU as the run started), kept in `RunStats` and updated
in the transaction that finishes a job (services/run_stats.py: this module
only reads). The forecast plays the queue forward with the policy's own
`decide` (queueapp/policy/forecast.py), slots of models that share a GPU
included. Every figure here is an estimate and the API
labels it so.

Why the forecast is built for speed: every 201 answer carries one, so its
cost is the submission's cost. Hence plain SQL into `Candidate`s, queue
lines loaded in batches (`LineFeed`), and a play that looks only at the
heads that can win a step (forecast.py). The job list places all its queued
jobs with one play (`queue_forecast_for`), not one per job, which made the
list many times slower than the queue view (docs/benchmarks.md, "Job list").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from functools import cached_property

from queueapp.durations import Durations
from queueapp.line_feed import LineFeed
from queueapp.liveness import gpus_with_live_dispatcher
from queueapp.models import Job, JobStatus, Member, Policy
from queueapp.policy import (
    Candidate,
    Forecast,
    ForecastGpu,
    InFlight,
    PolicySettings,
    play_forward,
    score,
)
from queueapp.policy.facts import ClusterFacts, MemberLimits, cluster_facts
from queueapp.policy.resident_sets import routing_of_parts
from queueapp.policy.score import Loaded
from queueapp.policy.wait_bound import GpuHeld, Holder, busy_message, retry_after
from queueapp.selectors import (
    JobsWithWebhooks,
    db_now,
    gpus_list,
    jobs_reread,
    model_parallels,
    policy_get,
    policy_settings,
    running_jobs,
)
from queueapp.upstream.client import is_preload

# How many jobs the forecast plays forward at most (each step ranks every
# line head, so this bounds the cost of an answer).
FORECAST_HORIZON = 300


@dataclass(frozen=True)
class QueueForecast:
    now: datetime
    paused: bool
    # The GPUs as the play started: when each frees, what it has loaded.
    gpus: list[ForecastGpu]
    settings: PolicySettings
    order: list[Forecast]
    candidates: dict[int, Candidate]
    complete: bool  # False when the play stopped before the queue was empty
    # When each running job should end (several may share a GPU).
    running_ends: dict[int, datetime] = field(default_factory=dict)
    # The running jobs the play started with (member, tier and GPU loaded).
    running: list[Job] = field(default_factory=list)
    # The jobs (running or queued) whose run has no estimate: nothing of
    # their model learned and no typical run set. A start after one of them
    # is a guess (`is_guess`).
    unknown_runs: frozenset[int] = frozenset()

    @property
    def resident_model(self) -> str | None:
        """The first GPU's loaded model (the one GPU's, on one GPU)."""
        return self.gpus[0].resident_model if self.gpus else None

    @property
    def gpu_free_at(self) -> datetime:
        """When the first GPU frees (now, when one stands idle)."""
        first = min((gpu.free_at for gpu in self.gpus), default=self.now.timestamp())
        return self.now + timedelta(seconds=max(0.0, first - self.now.timestamp()))

    def expected_end_of(self, job_id: int) -> datetime | None:
        """When running job `job_id` should end (None: it was not running)."""
        return self.running_ends.get(job_id)

    def gpu_free_at_for(self, name: str) -> datetime | None:
        """When GPU `name` frees: its last job in flight ends."""
        for gpu in self.gpus:
            if gpu.name == name:
                return self.now + timedelta(seconds=max(0.0, gpu.free_at - self.now.timestamp()))
        return None

    @cached_property
    def jobs(self) -> dict[int, Job]:
        """The jobs in `order`, with member and tier, loaded on first use.

        The play itself works on plain rows; only the queue view needs the
        model instances, and only those it lists.
        """
        ids = [place.job_id for place in self.order]
        return Job.objects.select_related("member__tier").defer("body").in_bulk(ids)

    @cached_property
    def _places(self) -> dict[int, Forecast]:
        return {place.job_id: place for place in self.order}

    def for_job(self, job_id: int) -> Forecast | None:
        return self._places.get(job_id)

    @cached_property
    def _first_unknown_position(self) -> float:
        """The place of the first job played whose run is unknown; before
        the queue (0) when a running one's is; after it when none is."""
        if any(job.pk in self.unknown_runs for job in self.running):
            return 0
        return min(
            (place.position for place in self.order if place.job_id in self.unknown_runs),
            default=math.inf,
        )

    def is_guess(self, place: Forecast) -> bool:
        """Whether `place`'s start rests on a run of which nothing is known:
        one running now, or one played before it (on any GPU: the play
        gives each GPU the jobs in turn, so a guess anywhere may move it)."""
        return self._first_unknown_position < place.position

    def seconds_until_start(self, job_ids: Sequence[int]) -> float | None:
        """Seconds until the first of `job_ids` is forecast to start; None
        when the play placed none of them."""
        starts = [place.estimated_start for i in job_ids if (place := self.for_job(i))]
        return max(0.0, min(starts) - self.now.timestamp()) if starts else None

    def start_estimate(self, job: Job) -> StartEstimate:
        """When queued job `job` should start, how many start before it, and
        what runs on each GPU it could use."""
        place = self.for_job(job.pk)
        if place is not None:
            start_in: float | None = max(0.0, place.estimated_start - self.now.timestamp())
            ahead = place.position - 1
        else:  # past the horizon, or no GPU runs its model
            start_in, ahead = None, len(self.order)
        # Not placed within the horizon: it starts after the last job placed.
        at_least = (
            max(0.0, self.order[-1].estimated_start - self.now.timestamp())
            if place is None and self.order and not self.complete
            else None
        )
        usable = [g for g in self.gpus if g.runs_models is None or job.model in g.runs_models]
        return StartEstimate(
            start_in=start_in,
            ahead=ahead,
            gpus=[
                GpuHeld(
                    name=gpu.name,
                    holders=tuple(
                        Holder(
                            job_id=running.pk,
                            model=running.model,
                            band=running.priority,
                            held_seconds=max(
                                0.0, (self.now - (running.started_at or self.now)).total_seconds()
                            ),
                        )
                        for running in self.running
                        if (running.gpu.name if running.gpu else "") == gpu.name
                    ),
                )
                for gpu in usable
            ],
            first_gpu_free_in=(self.gpu_free_at - self.now).total_seconds(),
            at_least=at_least,
        )

    def start_of(self, forecast: Forecast) -> datetime:
        return self.now + timedelta(seconds=forecast.estimated_start - self.now.timestamp())

    def terms_now(self, job_id: int) -> dict[str, float]:
        """The job's score terms at this instant (not at its forecast start),
        its swap affinity as the GPU it is forecast to run on has it."""
        place = self._places.get(job_id)
        first = self.gpus[0] if self.gpus else None
        for gpu in self.gpus:
            if place is not None and gpu.name == place.gpu:
                first = gpu
        resident: Loaded = None
        if first is not None:
            named = {first.resident_model} if first.resident_model else set()
            resident = first.resident_models | named
        return score(
            self.candidates[job_id],
            now=self.now.timestamp(),
            resident_model=resident,
            settings=self.settings,
        ).as_dict()


@dataclass(frozen=True)
class StartEstimate:
    """A queued job's forecast start, as a wait bound judges it."""

    start_in: float | None  # seconds from now; None: the play did not place it
    ahead: int  # jobs forecast to start before it
    gpus: list[GpuHeld]  # the GPUs it could use, with what runs there
    first_gpu_free_in: float  # seconds until the first GPU frees
    # Unplaced because the play stopped at its horizon: the seconds until the
    # last job it placed starts, before which this one cannot; else None.
    at_least: float | None = None

    def misses(self, bound: float) -> bool:
        """Whether it cannot start within `bound` seconds by the forecast. A
        job past the horizon misses only when the horizon's last start
        already lies past the bound; one no play places (no GPU runs it) misses."""
        if self.start_in is not None:
            return self.start_in > bound
        return self.at_least is None or self.at_least > bound

    def message(self, tail: str) -> str:
        return busy_message(gpus=self.gpus, ahead=self.ahead, tail=tail)

    @property
    def retry_after(self) -> int:
        """Seconds until it could start (when the first GPU frees, unplaced)."""
        known = self.start_in if self.start_in is not None else self.at_least
        return retry_after(
            known if known is not None else self.first_gpu_free_in,
            fallback=RETRY_FALLBACK_SECONDS,
        )


# Retry-After when no forecast figure applies (nothing runs, nothing placed).
RETRY_FALLBACK_SECONDS = 5


def queue_forecast(*, horizon: int | None = None, include: Sequence[Job] = ()) -> QueueForecast:
    """The queue's dispatch order and start times if nothing new arrives.

    Plays forward at most `horizon` jobs. The queue lines of the jobs in
    `include` (queued ones) are played even when their heads rank too low
    for the horizon; with one job included, the play stops once it is placed.
    A job past its wait bound leaves the play as the claim expires it, but
    those in `include`: the question is when they would start, and their
    bound is judged by the answer.
    """
    horizon = horizon or FORECAST_HORIZON
    policy = policy_get()
    settings = policy_settings(policy)
    now = db_now()
    durations = Durations.load()
    running = running_jobs()
    parallel = {model: n for model, n in model_parallels().items() if n > 1}
    ends = {job.pk: _expected_end(job, now=now, durations=durations) for job in running}
    enabled = sum(1 for gpu in gpus_list() if gpu.enabled)
    facts = _forecast_facts(
        enabled_gpus=enabled, policy=policy, durations=durations, limits=MemberLimits()
    )
    gpus = _forecast_gpus(running, ends=ends, now=now, facts=facts, parallel=parallel)
    heads = (
        Job.objects.filter(status=JobStatus.QUEUED, is_lane_head=True)
        .order_by("-rank_key", "id")
        .values_list("member_id", "priority", "model")
    )
    lines = set(heads[:horizon])
    loaded = {gpu.resident_model for gpu in gpus if gpu.resident_model}
    for resident in loaded.union(*(gpu.resident_models for gpu in gpus)):
        lines |= set(heads.filter(model=resident)[:horizon])
    lines.update((job.member_id, job.priority, job.model) for job in include)
    feed = LineFeed(
        batch=max(2, math.ceil(horizon / max(1, len(lines)))),
        unbounded=frozenset(job.pk for job in include),
    )
    candidates = feed.load_lines(lines)
    if not facts.alone:  # the limits bind
        facts = _forecast_facts(
            enabled_gpus=enabled,
            policy=policy,
            durations=durations,
            limits=_member_limits(candidates, running),
        )
    order = play_forward(
        candidates,
        now=now.timestamp(),
        gpu_free_at=now.timestamp(),
        resident_model=None,
        gpus=gpus,
        settings=settings,
        run_seconds=lambda c: durations.job_run_seconds(
            c.model, feed.paths[c.job_id], feed.sizes[c.job_id]
        ),
        run_seconds_in_flight=lambda c, in_flight: durations.job_run_seconds(
            c.model, feed.paths[c.job_id], feed.sizes[c.job_id], in_flight
        ),
        swap_seconds=durations.swap_seconds,
        stop_after=horizon,
        until_job_id=include[0].pk if len(include) == 1 else None,
        more_in_line=feed.after,
        running_limit=facts.running_limit,
        running_until=_running_until(running, ends),
        borrowing=facts.borrowing,
    )
    unknown = {job.pk for job in running if not durations.knows(job.model, job.path)}
    unknown.update(
        place.job_id
        for place in order
        if not durations.knows(feed.candidates[place.job_id].model, feed.paths[place.job_id])
    )
    return QueueForecast(
        now=now,
        paused=policy.dispatch_paused,
        gpus=gpus,
        settings=settings,
        order=order,
        candidates=feed.candidates,
        complete=len(order) < horizon,
        running_ends=ends,
        running=running,
        unknown_runs=frozenset(unknown),
    )


def _forecast_facts(
    *, enabled_gpus: int, policy: Policy, durations: Durations, limits: MemberLimits
) -> ClusterFacts:
    """What the play's decisions rest on, as the claim's (policy/facts.py):
    whether a GPU is alone (the enabled GPUs, whether their dispatcher runs
    now or not), the members' running limits, the borrowing guard and the
    models known to run short."""
    return cluster_facts(
        enabled_gpus=enabled_gpus,
        gpus_held={},  # the play counts them from `running_until`
        limits=limits,
        keep_idle=policy.borrow_keep_idle_gpus,
        borrow_max_seconds=policy.borrow_max_seconds,
        expected_seconds=durations.expected_per_model(),
    )


def _member_limits(candidates: list[Candidate], running: list[Job]) -> MemberLimits:
    """The running limits of the members the play may meet (their tiers')."""
    members = {candidate.member_id for candidate in candidates} | {j.member_id for j in running}
    tiers = Member.objects.filter(pk__in=members).values_list(
        "pk", "tier__max_running_jobs", "tier__strict_running_limit"
    )
    return MemberLimits(
        limits={member: limit for member, limit, _ in tiers},
        strict=frozenset(member for member, _, strict in tiers if strict),
    )


def _running_until(running: list[Job], ends: dict[int, datetime]) -> dict[int, list]:
    """When each member's running jobs should end, and on which GPU (by name)."""
    running_until: dict[int, list[tuple[float, str]]] = {}
    for job in running:
        gpu = job.gpu.name if job.gpu else ""
        running_until.setdefault(job.member_id, []).append((ends[job.pk].timestamp(), gpu))
    return running_until


def _expected_end(job: Job, *, now: datetime, durations: Durations) -> datetime:
    """When a running job should end: its start plus what a run of its size
    takes on its model and path at the concurrency it started with."""
    if job.started_at is None:
        return now
    in_flight = getattr(job, "in_flight", 1)
    expected = durations.job_run_seconds(job.model, job.path, job.size, in_flight)
    if is_preload(job.path):
        expected = durations.swap_seconds(job.model)  # it runs only while it loads
    return max(now, job.started_at + timedelta(seconds=expected))


def _forecast_gpus(
    running: list[Job],
    *,
    ends: dict[int, datetime],
    now: datetime,
    facts: ClusterFacts,
    parallel: dict[str, int],
) -> list[ForecastGpu]:
    """The GPUs that will claim (enabled, reachable, their dispatcher
    alive; when none is, the enabled ones), each with its running jobs and
    when they should end; with no GPU enabled, one GPU as the first GPU's
    running jobs leave it."""
    on_gpu: dict[int | None, list[Job]] = {}
    for job in running:
        on_gpu.setdefault(job.gpu_id, []).append(job)
    registered = gpus_list()
    alive = gpus_with_live_dispatcher()
    gpus = [gpu for gpu in registered if gpu.enabled and gpu.reachable and gpu.pk in alive]
    # None claims now (the dispatchers are restarting, or none was ever
    # started): the estimate assumes the enabled ones come back.
    gpus = gpus or [gpu for gpu in registered if gpu.enabled]
    if not gpus:
        jobs = next(iter(on_gpu.values()), [])
        return [_forecast_gpu("", jobs, None, None, ends=ends, now=now, parallel=parallel)]
    return [
        replace(
            _forecast_gpu(
                gpu.name,
                on_gpu.get(gpu.pk, []),
                gpu.resident_model or None,
                facts.runs(gpu.served_models, gpu.allowed_models),
                ends=ends,
                now=now,
                parallel=parallel,
            ),
            min_band=gpu.min_band,
            short_models=facts.short_models(gpu.max_expected_seconds),
            short_under=gpu.max_expected_seconds,
            resident_models=frozenset(gpu.resident_models),
            routing=None if gpu.one_model_at_a_time else routing_of_parts(gpu.routing),
        )
        for gpu in gpus
    ]


def _forecast_gpu(
    name: str,
    running: list[Job],
    resident: str | None,
    runs: frozenset[str] | None,
    *,
    ends: dict[int, datetime],
    now: datetime,
    parallel: dict[str, int],
) -> ForecastGpu:
    in_flight = tuple(
        InFlight(job.model, ends[job.pk].timestamp())
        for job in running
        if job.started_at is not None
    )
    if in_flight:
        resident = in_flight[-1].model
    return ForecastGpu(
        name=name,
        free_at=max((job.ends_at for job in in_flight), default=now.timestamp()),
        resident_model=resident,
        runs_models=runs,
        in_flight=in_flight,
        parallel=parallel,
    )


def queue_forecast_for(page: JobsWithWebhooks) -> tuple[QueueForecast | None, JobsWithWebhooks]:
    """One forecast that places every queued job of `page` (None when none is
    queued), and `page` with the queued jobs the forecast did not find read
    again: claimed or cancelled since they were read, or too deep in their
    line for the forecast to load them.

    The forecast plays the queue lines of every listed job, as the forecast
    of a single job plays its own line: as long as the queue has no more
    lines than the horizon (every line is played then), each job's place is
    the one its own forecast gives.
    """
    queued = [job for job in page.jobs if job.status == JobStatus.QUEUED]
    if not queued:
        return None, page
    forecast = queue_forecast(include=queued)
    missing = [job.pk for job in queued if job.pk not in forecast.candidates]
    if not missing:
        return forecast, page
    reread = jobs_reread(ids=missing)
    jobs = [reread.get(job.pk, job) for job in page.jobs]
    return forecast, replace(page, jobs=jobs)


def job_start_estimate(job: Job) -> StartEstimate:
    """The forecast of queued job `job`'s start (its line played even when
    it ranks past the horizon), as a wait bound judges it."""
    return queue_forecast(include=[job]).start_estimate(job)


def seconds_until_first_start(job_ids: Sequence[int]) -> int:
    """Retry-After for a caller that must wait for one of `job_ids` (queued
    jobs) to start: the forecast's seconds until the first does, else until
    the first GPU frees; at least a second."""
    queued = list(
        Job.objects.filter(pk__in=job_ids, status=JobStatus.QUEUED).only(
            "member_id", "priority", "model"
        )
    )
    forecast = queue_forecast(include=queued) if queued else queue_forecast(horizon=1)
    seconds = forecast.seconds_until_start(job_ids)
    if seconds is None:
        seconds = (forecast.gpu_free_at - forecast.now).total_seconds()
    return retry_after(seconds, fallback=RETRY_FALLBACK_SECONDS)
