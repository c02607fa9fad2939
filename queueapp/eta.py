"""Estimates: what jobs take, learned from finished ones, and when a queued job starts.

Durations are decayed averages per (model, path), kept in `RunStats` and
updated in the transaction that finishes a job. The forecast plays the queue
forward with the policy's own `rank` (queueapp/policy/forecast.py). Every
figure here is an estimate and the API labels it so.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import connection

from queueapp.models import Job, RunStats
from queueapp.policy import Candidate, Forecast, play_forward
from queueapp.selectors import (
    db_now,
    job_candidate,
    policy_get,
    policy_settings,
    queued_jobs,
    running_job,
    upstream_state_get,
)

# Weight of the newest run in the decayed average: about the last 5 runs count.
NEWEST_RUN_WEIGHT = 0.3
# Used until a model and path has finished at least once.
DEFAULT_RUN_SECONDS = 60.0
# How many jobs the forecast plays forward at most.
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
    gpu_free_at: datetime
    order: list[Forecast]
    jobs: dict[int, Job]
    complete: bool  # False when more jobs are queued than were played forward

    def for_job(self, job_id: int) -> Forecast | None:
        return next((f for f in self.order if f.job_id == job_id), None)

    def start_of(self, forecast: Forecast) -> datetime:
        return self.now + timedelta(seconds=forecast.estimated_start - self.now.timestamp())


def queue_forecast(*, horizon: int = FORECAST_HORIZON, include: Job | None = None) -> QueueForecast:
    """The queue's dispatch order and start times if nothing new arrives."""
    policy = policy_get()
    settings = policy_settings(policy)
    resident = upstream_state_get().resident_model or None
    now = db_now()
    durations = Durations.load()
    ordered = queued_jobs().order_by("-rank_key", "id")
    jobs = {job.pk: job for job in ordered[:horizon]}
    if resident:
        jobs.update({job.pk: job for job in ordered.filter(model=resident)[:horizon]})
    if include is not None:
        jobs[include.pk] = include
    running = running_job()
    gpu_free_at = now
    if running is not None and running.started_at is not None:
        expected = durations.run_seconds(running.model, running.path)
        gpu_free_at = max(now, running.started_at + timedelta(seconds=expected))
        resident = running.model
    candidates: list[Candidate] = [job_candidate(job) for job in jobs.values()]
    order = play_forward(
        candidates,
        now=now.timestamp(),
        gpu_free_at=gpu_free_at.timestamp(),
        resident_model=resident,
        settings=settings,
        run_seconds=lambda c: durations.run_seconds(c.model, jobs[c.job_id].path),
        swap_seconds=durations.swap_seconds,
    )
    return QueueForecast(
        now=now,
        paused=policy.dispatch_paused,
        resident_model=resident,
        gpu_free_at=gpu_free_at,
        order=order,
        jobs=jobs,
        complete=len(jobs) < horizon or queued_jobs().count() <= len(jobs),
    )
