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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from functools import cached_property
from typing import Any

from django.db import connection

from queueapp.liveness import gpus_with_live_dispatcher
from queueapp.models import Job, JobStatus, Member, Policy, RunStats
from queueapp.policy import (
    Candidate,
    Forecast,
    ForecastGpu,
    InFlight,
    PolicySettings,
    batched_seconds,
    play_forward,
    score,
)
from queueapp.policy.decide import Borrowing
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

# Used until a model and path has finished at least once.
DEFAULT_RUN_SECONDS = 60.0
# How many jobs the forecast plays forward at most (each step ranks every
# line head, so this bounds the cost of an answer).
FORECAST_HORIZON = 300


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


class Durations:
    """Run and swap seconds per model and path, from RunStats.

    Alone (concurrency 1), with fallbacks: the same model on other paths,
    then all models, then DEFAULT_RUN_SECONDS. With `concurrency` jobs
    sharing the GPU, a level's own average once one is learned; before, the
    nearest learned level of the same model and path, else the alone figure,
    scaled as a batching server slows (`policy.batched_seconds`). Swaps are
    learned alone: a model is loaded only onto a GPU with nothing in flight.
    """

    def __init__(self, rows: list[RunStats]) -> None:
        self.levels: dict[tuple[str, str], dict[int, RunStats]] = {}
        # A preload (upstream.client.is_preload) runs nothing: its cold run
        # is its model's swap, and it says nothing of the model's runs.
        self.preload_swaps = {
            row.model: row.cold_seconds
            for row in rows
            if is_preload(row.path) and row.concurrency == 1 and row.cold_seconds is not None
        }
        rows = [row for row in rows if not is_preload(row.path)]
        for row in rows:
            self.levels.setdefault((row.model, row.path), {})[row.concurrency] = row
        alone = [row for row in rows if row.concurrency == 1]
        self.rows = {(row.model, row.path): row for row in alone}
        warm = [row.warm_seconds for row in alone if row.warm_seconds is not None]
        self.typical_run = _mean(warm) or DEFAULT_RUN_SECONDS
        swaps = [s for row in alone if (s := self._swap(row)) is not None]
        self.typical_swap = _mean([*swaps, *self.preload_swaps.values()]) or 0.0

    @classmethod
    def load(cls) -> Durations:
        return cls(list(RunStats.objects.all()))

    def models_shorter_than(self, seconds: float) -> list[str]:
        """Models whose every learned path runs under `seconds` alone. A
        model that has not finished a run yet is not among them: a GPU
        reserved for short work does not gamble on it."""
        models = {model for model, _ in self.levels}
        return sorted(
            model
            for model in models
            if all(
                self.run_seconds(model, path) < seconds
                for known, path in self.levels
                if known == model
            )
        )

    @staticmethod
    def _swap(row: RunStats) -> float | None:
        if row.warm_seconds is None or row.cold_seconds is None:
            return None
        return max(0.0, row.cold_seconds - row.warm_seconds)

    def run_seconds(self, model: str, path: str, concurrency: int = 1) -> float:
        """A run without its swap; a preload's is none: all it takes is its swap."""
        if is_preload(path):
            return 0.0
        level = max(1, concurrency)
        learned = self._learned(model, path)
        if level in learned:
            return learned[level]
        if learned:
            # Ties go to the lower level: it has run more often.
            nearest = min(learned, key=lambda known: (abs(known - level), known))
            return learned[nearest] * batched_seconds(1.0, level) / batched_seconds(1.0, nearest)
        same_model = [
            r.warm_seconds for r in self.rows.values() if r.model == model and r.warm_seconds
        ]
        return batched_seconds(_mean(same_model) or self.typical_run, level)

    def _learned(self, model: str, path: str) -> dict[int, float]:
        """Per concurrency level, what runs of this model and path took."""
        learned: dict[int, float] = {}
        for level, row in self.levels.get((model, path), {}).items():
            if row.warm_seconds is not None:
                learned[level] = row.warm_seconds
            elif row.cold_seconds is not None:
                learned[level] = max(0.0, row.cold_seconds - self.swap_seconds(model))
        return learned

    def swap_seconds(self, model: str) -> float:
        swaps = [
            s
            for row in self.rows.values()
            if row.model == model and (s := self._swap(row)) is not None
        ]
        if model in self.preload_swaps:
            swaps.append(self.preload_swaps[model])
        # A swap measured as free (0.0) is a measurement, not a missing one.
        own = _mean(swaps)
        return self.typical_swap if own is None else own


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
        resident = self.resident_model
        for gpu in self.gpus:
            if place is not None and gpu.name == place.gpu:
                resident = gpu.resident_model
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


# A line that runs out during the play is among those that go often (its
# band leads), so its next batch is larger than the first: fewer queries.
AFTER_BATCH_FACTOR = 4

Line = tuple[int, int, str]  # member, band, model
_LINE_START = 0  # no job loaded yet: from the line's first


class LineFeed:
    """Loads queue lines' jobs for the forecast in batches, in line order.

    Plain SQL into `Candidate`s: an answer may read several hundred jobs,
    and building model instances for them cost more than playing the queue.
    When a line runs out during the play, the next batch of every line of
    its band comes in the same query: lines of one band take turns, so they
    run out together.
    """

    def __init__(self, batch: int) -> None:
        self.batch = batch
        self.candidates: dict[int, Candidate] = {}
        self.paths: dict[int, str] = {}
        # Per line, the last job loaded: the next batch starts after it.
        self.loaded_to: dict[Line, int] = {}
        # Lines whose every queued job is loaded: a fetch returned less than
        # it asked for, so asking again would return nothing.
        self.complete: set[Line] = set()
        # Next batches fetched along with another line's, not yet asked for.
        self.fetched_ahead: dict[Line, list[Candidate]] = {}

    def load_lines(self, lines: set[Line]) -> list[Candidate]:
        found = self._fetch_lines(dict.fromkeys(lines, _LINE_START), self.batch)
        return [candidate for batch in found.values() for candidate in batch]

    def after(self, last: Candidate) -> list[Candidate]:
        """The next jobs of `last`'s queue line, in line order."""
        line = last.line
        if line in self.fetched_ahead:
            return self.fetched_ahead.pop(line)
        if line in self.complete:
            return []
        band_lines = {
            other: self.loaded_to[other]
            for other in self.loaded_to
            if other[1] == last.band
            and other not in self.complete
            and other not in self.fetched_ahead
        }
        found = self._fetch_lines(band_lines, self.batch * AFTER_BATCH_FACTOR)
        for other, batch in found.items():
            if other != line and batch:
                self.fetched_ahead[other] = batch
        return found.get(line, [])

    def _fetch_lines(self, lines: dict[Line, int], limit: int) -> dict[Line, list[Candidate]]:
        """Up to `limit` jobs of each line after the job given (0: from its start)."""
        if not lines:
            return {}
        members, bands, models = zip(*lines, strict=True)
        after_ids = lines.values()
        with connection.cursor() as cursor:
            # One index range scan per line (job_queued_lane), not a scan of
            # every queued job of these members.
            cursor.execute(
                """
                SELECT job.id, job.priority, tier.bonus, job.model,
                       EXTRACT(EPOCH FROM job.submitted_at)::float8,
                       EXTRACT(EPOCH FROM CASE WHEN job.is_lane_head THEN job.eligible_at
                           ELSE GREATEST(job.submitted_at, lane.last_dispatched_at) END)::float8,
                       job.member_id, job.path, job.pinned_gpu
                  FROM unnest(%s::bigint[], %s::integer[], %s::text[], %s::bigint[])
                       AS line(member_id, band, model, after_id)
                  LEFT JOIN LATERAL (
                       SELECT submitted_at FROM queueapp_job WHERE id = line.after_id
                       ) AS last ON true
                 CROSS JOIN LATERAL (
                       SELECT * FROM queueapp_job
                        WHERE member_id = line.member_id AND priority = line.band
                          AND model = line.model AND status = 'queued'
                          AND (submitted_at, id)
                              > (COALESCE(last.submitted_at, '-infinity'), line.after_id)
                        ORDER BY submitted_at, id
                        LIMIT %s) AS job
                  JOIN queueapp_member AS member ON member.id = job.member_id
                  JOIN queueapp_tier AS tier ON tier.id = member.tier_id
                  LEFT JOIN queueapp_lane AS lane
                         ON lane.member_id = job.member_id AND lane.band = job.priority
                 ORDER BY job.member_id, job.priority, job.model, job.submitted_at, job.id
                """,
                [list(members), list(bands), list(models), list(after_ids), limit],
            )
            rows = cursor.fetchall()
        found: dict[Line, list[Candidate]] = {line: [] for line in lines}
        for job_id, band, bonus, model, submitted, eligible, member_id, path, pinned in rows:
            # A line head ages from its own `eligible_at`; a job behind it
            # from the later of its submission and its lane's clock
            # (GREATEST ignores a missing clock), as `job_candidate` says.
            candidate = Candidate(
                job_id=job_id,
                band=band,
                tier_bonus=bonus,
                model=model,
                # Epoch seconds as float8 are the same doubles as
                # datetime.timestamp() gives (both round the exact value).
                submitted_at=submitted,
                eligible_at=eligible,
                member_id=member_id,
                pinned_gpu=pinned or None,
            )
            self.candidates[job_id] = candidate
            self.paths[job_id] = path
            found[candidate.line].append(candidate)
            self.loaded_to[candidate.line] = job_id
        self.complete.update(line for line, batch in found.items() if len(batch) < limit)
        return found


def queue_forecast(*, horizon: int | None = None, include: Sequence[Job] = ()) -> QueueForecast:
    """The queue's dispatch order and start times if nothing new arrives.

    Plays forward at most `horizon` jobs. The queue lines of the jobs in
    `include` (queued ones) are played even when their heads rank too low
    for the horizon; with one job included, the play stops once it is placed.
    """
    horizon = horizon or FORECAST_HORIZON
    policy = policy_get()
    settings = policy_settings(policy)
    now = db_now()
    durations = Durations.load()
    running = running_jobs()
    parallel = {model: n for model, n in model_parallels().items() if n > 1}
    ends = {job.pk: _expected_end(job, now=now, durations=durations) for job in running}
    gpus = _forecast_gpus(running, ends=ends, now=now, durations=durations, parallel=parallel)
    heads = (
        Job.objects.filter(status=JobStatus.QUEUED, is_lane_head=True)
        .order_by("-rank_key", "id")
        .values_list("member_id", "priority", "model")
    )
    lines = set(heads[:horizon])
    for resident in {gpu.resident_model for gpu in gpus if gpu.resident_model}:
        lines |= set(heads.filter(model=resident)[:horizon])
    lines.update((job.member_id, job.priority, job.model) for job in include)
    feed = LineFeed(batch=max(2, math.ceil(horizon / max(1, len(lines)))))
    candidates = feed.load_lines(lines)
    order = play_forward(
        candidates,
        now=now.timestamp(),
        gpu_free_at=now.timestamp(),
        resident_model=None,
        gpus=gpus,
        settings=settings,
        run_seconds=lambda c: durations.run_seconds(c.model, feed.paths[c.job_id]),
        run_seconds_in_flight=lambda c, in_flight: durations.run_seconds(
            c.model, feed.paths[c.job_id], in_flight
        ),
        swap_seconds=durations.swap_seconds,
        stop_after=horizon,
        until_job_id=include[0].pk if len(include) == 1 else None,
        more_in_line=feed.after,
        **_running_limits(
            candidates,
            running,
            ends=ends,
            alone=len(gpus) <= 1,
            policy=policy,
            durations=durations,
        ),
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
    )


def _running_limits(
    candidates: list[Candidate],
    running: list[Job],
    *,
    ends: dict[int, datetime],
    alone: bool,
    policy: Policy,
    durations: Durations,
) -> dict[str, Any]:
    """`play_forward`'s running limit per member (their tier's), when
    their running jobs should end, and where, and the borrowing guard
    (the claim's: dispatch/snapshot.py); nothing to play `alone` on one
    GPU: the limit counts GPUs held, and one GPU's jobs share it."""
    if alone:
        return {}
    members = {candidate.member_id for candidate in candidates} | {j.member_id for j in running}
    tiers = Member.objects.filter(pk__in=members).values_list(
        "pk", "tier__max_running_jobs", "tier__strict_running_limit"
    )
    limits = {member: limit for member, limit, _ in tiers}
    running_until: dict[int, list[tuple[float, str]]] = {}
    for job in running:
        gpu = job.gpu.name if job.gpu else ""
        running_until.setdefault(job.member_id, []).append((ends[job.pk].timestamp(), gpu))
    return {
        "running_limit": lambda member: limits.get(member, 1),
        "running_until": running_until,
        "borrowing": policy_borrowing(
            policy,
            strict_members=[member for member, _, strict in tiers if strict],
            durations=durations,
        ),
    }


def policy_borrowing(
    policy: Policy, *, strict_members: Iterable[int], durations: Durations | None = None
) -> Borrowing:
    """The policy's borrowing guard as `decide` reads it (the claim's and the
    forecast's): its models known to run under `borrow_max_seconds` learned
    from `durations` (read when needed), and who may never borrow."""
    max_seconds = policy.borrow_max_seconds
    short: list[str] = []
    if max_seconds is not None:
        short = (durations or Durations.load()).models_shorter_than(max_seconds)
    return Borrowing(
        keep_idle=policy.borrow_keep_idle_gpus,
        max_seconds=max_seconds,
        short_models=frozenset(short),
        strict_members=frozenset(strict_members),
    )


def _expected_end(job: Job, *, now: datetime, durations: Durations) -> datetime:
    """When a running job should end: its start plus what runs of its model
    and path take at the concurrency it started with."""
    if job.started_at is None:
        return now
    in_flight = getattr(job, "in_flight", 1)
    expected = durations.run_seconds(job.model, job.path, in_flight)
    if is_preload(job.path):
        expected = durations.swap_seconds(job.model)  # it runs only while it loads
    return max(now, job.started_at + timedelta(seconds=expected))


def _forecast_gpus(
    running: list[Job],
    *,
    ends: dict[int, datetime],
    now: datetime,
    durations: Durations,
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
                gpu.runs_models(alone=len(gpus) == 1),
                ends=ends,
                now=now,
                parallel=parallel,
            ),
            min_band=gpu.min_band,
            short_models=None
            if gpu.max_expected_seconds is None
            else frozenset(durations.models_shorter_than(gpu.max_expected_seconds)),
        )
        for gpu in gpus
    ]


def _forecast_gpu(
    name: str,
    running: list[Job],
    resident: str | None,
    runs: list[str] | None,
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
        runs_models=None if runs is None else frozenset(runs),
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
