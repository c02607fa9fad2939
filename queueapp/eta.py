"""Estimates: what jobs take, learned from finished ones, and when a queued job starts.

Durations are decayed averages per (model, path), kept in `RunStats` and
updated in the transaction that finishes a job. The forecast plays the queue
forward with the policy's own `rank` (queueapp/policy/forecast.py). Every
figure here is an estimate and the API labels it so.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import connection
from django.db.models import Q

from queueapp.models import Job, Lane, RunStats
from queueapp.policy import Candidate, Forecast, PolicySettings, play_forward, score
from queueapp.selectors import (
    db_now,
    job_candidate,
    policy_get,
    policy_settings,
    queued_jobs,
    queued_lane_heads,
    running_job,
    upstream_state_get,
)

# Weight of the newest run in the decayed average: about the last 5 runs count.
NEWEST_RUN_WEIGHT = 0.3
# Used until a model and path has finished at least once.
DEFAULT_RUN_SECONDS = 60.0
# How many jobs the forecast plays forward at most (each step ranks every
# line head, so this bounds the cost of an answer).
FORECAST_HORIZON = 300


def run_stats_record(*, model: str, path: str, seconds: float, swapped: bool) -> None:
    """Fold one finished run into the decayed averages (one atomic upsert)."""
    column = "cold" if swapped else "warm"
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            INSERT INTO queueapp_runstats
                (model, path, warm_seconds, warm_samples, cold_seconds, cold_samples, updated_at)
            VALUES (%(model)s, %(path)s, %(warm)s, %(warm_n)s, %(cold)s, %(cold_n)s, now())
            ON CONFLICT (model, path) DO UPDATE SET
                {column}_seconds = COALESCE(
                    queueapp_runstats.{column}_seconds * (1 - %(weight)s)
                    + %(seconds)s * %(weight)s,
                    %(seconds)s),
                {column}_samples = queueapp_runstats.{column}_samples + 1,
                updated_at = now()
            """,
            {
                "model": model,
                "path": path,
                "seconds": seconds,
                "weight": NEWEST_RUN_WEIGHT,
                "warm": None if swapped else seconds,
                "warm_n": 0 if swapped else 1,
                "cold": seconds if swapped else None,
                "cold_n": 1 if swapped else 0,
            },
        )


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


class Durations:
    """Run and swap seconds per model and path, from RunStats, with fallbacks:
    the same model on other paths, then all models, then DEFAULT_RUN_SECONDS."""

    def __init__(self, rows: list[RunStats]) -> None:
        self.rows = {(row.model, row.path): row for row in rows}
        warm = [row.warm_seconds for row in rows if row.warm_seconds is not None]
        self.typical_run = _mean(warm) or DEFAULT_RUN_SECONDS
        self.typical_swap = _mean([s for row in rows if (s := self._swap(row)) is not None]) or 0.0

    @classmethod
    def load(cls) -> Durations:
        return cls(list(RunStats.objects.all()))

    @staticmethod
    def _swap(row: RunStats) -> float | None:
        if row.warm_seconds is None or row.cold_seconds is None:
            return None
        return max(0.0, row.cold_seconds - row.warm_seconds)

    def run_seconds(self, model: str, path: str) -> float:
        row = self.rows.get((model, path))
        if row is not None and row.warm_seconds is not None:
            return row.warm_seconds
        if row is not None and row.cold_seconds is not None:
            return max(0.0, row.cold_seconds - self.swap_seconds(model))
        same_model = [
            r.warm_seconds for r in self.rows.values() if r.model == model and r.warm_seconds
        ]
        return _mean(same_model) or self.typical_run

    def swap_seconds(self, model: str) -> float:
        swaps = [
            s
            for row in self.rows.values()
            if row.model == model and (s := self._swap(row)) is not None
        ]
        return _mean(swaps) or self.typical_swap


@dataclass(frozen=True)
class QueueForecast:
    now: datetime
    paused: bool
    resident_model: str | None
    settings: PolicySettings
    gpu_free_at: datetime
    order: list[Forecast]
    jobs: dict[int, Job]
    candidates: dict[int, Candidate]
    complete: bool  # False when the play stopped before the queue was empty

    def for_job(self, job_id: int) -> Forecast | None:
        return next((f for f in self.order if f.job_id == job_id), None)

    def start_of(self, forecast: Forecast) -> datetime:
        return self.now + timedelta(seconds=forecast.estimated_start - self.now.timestamp())

    def terms_now(self, job_id: int) -> dict[str, float]:
        """The job's score terms at this instant (not at its forecast start)."""
        return score(
            self.candidates[job_id],
            now=self.now.timestamp(),
            resident_model=self.resident_model,
            settings=self.settings,
        ).as_dict()


class LineFeed:
    """Loads queue lines' jobs for the forecast in batches, in line order."""

    def __init__(self, batch: int) -> None:
        self.batch = batch
        self.jobs: dict[int, Job] = {}
        self.candidates: dict[int, Candidate] = {}
        self.clocks: dict[tuple[int, int], datetime] = {}

    def load_lines(self, lines: set[tuple[int, int, str]]) -> list[Candidate]:
        if not lines:
            return []
        members, bands, models = zip(*lines, strict=True)
        with connection.cursor() as cursor:
            # One index range scan per line (job_queued_lane), not a scan of
            # every queued job of these members.
            cursor.execute(
                """
                SELECT job.id
                  FROM unnest(%s::bigint[], %s::integer[], %s::text[])
                       AS line(member_id, band, model)
                 CROSS JOIN LATERAL (
                       SELECT id FROM queueapp_job
                        WHERE member_id = line.member_id AND priority = line.band
                          AND model = line.model AND status = 'queued'
                        ORDER BY submitted_at, id
                        LIMIT %s) AS job
                """,
                [list(members), list(bands), list(models), self.batch],
            )
            ids = [row[0] for row in cursor.fetchall()]
        self.clocks.update(
            ((lane.member_id, lane.band), lane.last_dispatched_at)
            for lane in Lane.objects.filter(member_id__in=set(members), band__in=set(bands))
        )
        return self._candidates(queued_jobs().filter(pk__in=ids).defer("body"))

    def after(self, last: Candidate) -> list[Candidate]:
        """The next jobs of `last`'s queue line, in line order."""
        job = self.jobs[last.job_id]
        following = (
            queued_jobs()
            .filter(member_id=job.member_id, priority=job.priority, model=job.model)
            .filter(
                Q(submitted_at__gt=job.submitted_at)
                | Q(submitted_at=job.submitted_at, pk__gt=job.pk)
            )
            .defer("body")
            .order_by("submitted_at", "id")[: self.batch]
        )
        return self._candidates(following)

    def _candidates(self, jobs: Iterable[Job]) -> list[Candidate]:
        found = []
        for job in jobs:
            candidate = job_candidate(
                job, lane_clock=self.clocks.get((job.member_id, job.priority))
            )
            self.jobs[job.pk] = job
            self.candidates[job.pk] = candidate
            found.append(candidate)
        return found


def queue_forecast(*, horizon: int | None = None, include: Job | None = None) -> QueueForecast:
    """The queue's dispatch order and start times if nothing new arrives.

    Plays forward at most `horizon` jobs, and stops once `include` (a queued
    job) is placed.
    """
    horizon = horizon or FORECAST_HORIZON
    policy = policy_get()
    settings = policy_settings(policy)
    resident = upstream_state_get().resident_model or None
    now = db_now()
    durations = Durations.load()
    heads = queued_lane_heads().order_by("-rank_key", "id").only("member_id", "priority", "model")
    lines = {(job.member_id, job.priority, job.model) for job in heads[:horizon]}
    if resident:
        lines |= {
            (job.member_id, job.priority, job.model)
            for job in heads.filter(model=resident)[:horizon]
        }
    if include is not None:
        lines.add((include.member_id, include.priority, include.model))
    feed = LineFeed(batch=max(2, math.ceil(2 * horizon / max(1, len(lines)))))
    candidates = feed.load_lines(lines)
    running = running_job()
    gpu_free_at = now
    if running is not None and running.started_at is not None:
        expected = durations.run_seconds(running.model, running.path)
        gpu_free_at = max(now, running.started_at + timedelta(seconds=expected))
        resident = running.model
    order = play_forward(
        candidates,
        now=now.timestamp(),
        gpu_free_at=gpu_free_at.timestamp(),
        resident_model=resident,
        settings=settings,
        run_seconds=lambda c: durations.run_seconds(c.model, feed.jobs[c.job_id].path),
        swap_seconds=durations.swap_seconds,
        stop_after=horizon,
        until_job_id=include.pk if include is not None else None,
        more_in_line=feed.after,
    )
    return QueueForecast(
        now=now,
        paused=policy.dispatch_paused,
        resident_model=resident,
        settings=settings,
        gpu_free_at=gpu_free_at,
        order=order,
        jobs=feed.jobs,
        candidates=feed.candidates,
        complete=len(order) < horizon,
    )
