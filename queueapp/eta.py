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
from dataclasses import replace
from datetime import datetime, timedelta

from queueapp.durations import Durations
from queueapp.line_feed import LineFeed
from queueapp.models import Job, JobStatus, Member, Policy
from queueapp.policy import (
    Candidate,
    Forecast,
    ForecastGpu,
    InFlight,
    play_forward,
)
from queueapp.policy.expected import Basis
from queueapp.policy.facts import ClusterFacts, MemberLimits, cluster_facts
from queueapp.policy.resident_sets import routing_of_parts
from queueapp.policy.size_fit import run_so_far_median, spread_of
from queueapp.policy.wait_bound import retry_after
from queueapp.queue_forecast import RETRY_FALLBACK_SECONDS, QueueForecast, StartEstimate
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
        unknown_runs=_unknown_runs(running, order, feed, durations),
        p90s=feed.p90s,
    )


def _unknown_runs(
    running: list[Job], order: list[Forecast], feed: LineFeed, durations: Durations
) -> frozenset[int]:
    """The running and played jobs whose run has no estimate (`Durations.knows`)."""
    unknown = {job.pk for job in running if not durations.knows(job.model, job.path)}
    unknown.update(
        place.job_id
        for place in order
        if not durations.knows(feed.candidates[place.job_id].model, feed.paths[place.job_id])
    )
    return frozenset(unknown)


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
    takes on its model and path at the concurrency it started with; for a
    sized one, the median of the runs that lasted as long as it has so far
    (one past its estimate is not about to end: `run_so_far_median`). An
    estimate without a measured spread keeps the plain median: a spread
    assumed for it made the flood's ETAs twice as wrong (docs/benchmarks.md)."""
    if job.started_at is None:
        return now
    in_flight = getattr(job, "in_flight", 1)
    expected = durations.job_run_seconds(job.model, job.path, job.size, in_flight)
    if is_preload(job.path):
        expected = durations.swap_seconds(job.model)  # it runs only while it loads
    if job.expected_basis == Basis.SIZE and job.size is not None:
        # The spread its line measured says how much longer it may run.
        expected = run_so_far_median(
            median=expected,
            spread=spread_of(job.expected_p50, job.expected_p90),
            elapsed=(now - job.started_at).total_seconds(),
        )
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
    gpus = [gpu for gpu in registered if gpu.enabled and gpu.reachable and gpu.dispatcher_alive]
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
