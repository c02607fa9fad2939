"""Prometheus metrics: GET /metrics, computed from the database at scrape time.

The web server and the django-q2 worker are separate processes that share
only PostgreSQL, so in-process counters would each see a part of the picture;
a collector that runs a few GROUP BY queries per scrape sees all of it.
It sits in a registry of its own, not prometheus_client's global one, so
nothing is shared between tests or mixed with per-process default metrics.
Labels are bands, scheduling terms and model names: never members, prompts
or tokens, so the endpoint needs no authentication.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from django.db import connection
from django.db.models import Count, DurationField, ExpressionWrapper, Min, Q, TextField, Value
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Coalesce, Now
from django.http import HttpRequest, HttpResponse
from django.urls import path
from django.views.decorators.http import require_safe
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.utils import floatToGoString

from queueapp.models import DispatchDecision, Job, JobEvent, JobStatus
from queueapp.policy.running_long import RUNNING_LONG_FACTOR
from queueapp.selectors import busy_seconds_sql, model_parallels
from queueapp.upstream.client import PRELOAD_PATH_PREFIX

# From a short chat answer (1 s) to the longest batch job worth waiting for (30 min).
DURATION_BUCKETS: tuple[float, ...] = (1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800)
# Back-to-back dispatches cost milliseconds (the dispatcher's own overhead);
# the upper buckets are an empty queue.
GAP_BUCKETS: tuple[float, ...] = (0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1, 5, 30, 300)
# The histograms read only recent rows so a scrape stays cheap on big tables.
WINDOW = "24 hours"
TERMS: tuple[str, ...] = ("aging", "swap_affinity", "tier_bonus", "fairness")
WINDOW_NOTE = f"Over the last {WINDOW} (a sliding window, so it may decrease)."

HistogramRow = tuple[str, list[int], float]


def _histogram(
    table: str, value: str, where: str, params: Sequence[Any], bounds: Sequence[float], group: str
) -> list[HistogramRow]:
    """Per group: cumulative bucket counts (value <= bound), then +Inf, and the sum.

    One GROUP BY with a FILTER per bound, so the database does the bucketing.
    Every SQL fragment is a constant of this module; values travel as parameters.
    """
    buckets = ", ".join(f"count(*) FILTER (WHERE {value} <= %s)" for _ in bounds)
    sql = (
        f"SELECT {group}, {buckets}, count(*), coalesce(sum({value}), 0) "
        f"FROM {table} WHERE {where} GROUP BY 1 ORDER BY 1"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [*bounds, *params])
        return [(str(row[0]), list(row[1:-1]), float(row[-1])) for row in cursor.fetchall()]


def _buckets(bounds: Sequence[float], counts: Sequence[int]) -> list[tuple[str, float]]:
    return [(floatToGoString(b), c) for b, c in zip([*bounds, float("inf")], counts, strict=True)]


def _gpu_rows() -> list[dict[str, Any]]:
    """Each GPU's row, by column name: its llama-swap at the last check, its
    dispatches, its busy time and what holds it now."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT gpu.name, gpu.enabled, gpu.checked_at IS NOT NULL AS checked, gpu.reachable,
                   gpu.resident_model, decided.n AS dispatched, decided.swaps,
                   decided.idle_waiting, ran.busy, holding.seconds AS held_seconds,
                   holding.reported AS running_long
              FROM queueapp_gpu AS gpu
             CROSS JOIN LATERAL (
                   SELECT count(*) AS n,
                          count(*) FILTER (WHERE decision.swap_needed) AS swaps,
                          coalesce(sum(least(
                              decision.idle_seconds,
                              extract(epoch FROM decision.at - job.submitted_at)))
                              FILTER (WHERE decision.at >= now() - interval '{WINDOW}'),
                          0) AS idle_waiting
                     FROM queueapp_dispatchdecision AS decision
                     JOIN queueapp_job AS job ON job.id = decision.job_id
                    WHERE decision.gpu_id = gpu.id) AS decided
             CROSS JOIN LATERAL (
                   SELECT {busy_seconds_sql("gpu.id", f"interval '{WINDOW}'")} AS busy) AS ran
             CROSS JOIN LATERAL (
                   SELECT coalesce(extract(epoch FROM now() - min(job.started_at)), 0)::float8
                              AS seconds,
                          coalesce(bool_or(job.running_long_at IS NOT NULL), false)
                              AS reported
                     FROM queueapp_job AS job
                    WHERE job.gpu_id = gpu.id AND job.status = 'running') AS holding
             ORDER BY gpu.name
            """
        )
        names = [column.name for column in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def _gpu_work(gpus: Sequence[dict[str, Any]]) -> Iterator[Metric]:
    """What each GPU did: its dispatches, its swaps, its busy and idle time."""
    dispatched = CounterMetricFamily(
        "gpusched_gpu_dispatched", "Jobs dispatched on the GPU.", labels=["gpu"]
    )
    swaps = CounterMetricFamily(
        "gpusched_gpu_swaps", "Dispatches on the GPU that needed a model swap.", labels=["gpu"]
    )
    busy = GaugeMetricFamily(
        "gpusched_gpu_busy_seconds",
        f"Seconds the GPU ran a job. {WINDOW_NOTE}",
        labels=["gpu"],
    )
    idle_waiting = GaugeMetricFamily(
        "gpusched_gpu_idle_with_work_seconds",
        "Seconds the GPU stood idle while the job it started next was already queued. "
        + WINDOW_NOTE,
        labels=["gpu"],
    )
    for gpu in gpus:
        name = gpu["name"]
        dispatched.add_metric([name], gpu["dispatched"])
        swaps.add_metric([name], gpu["swaps"])
        idle_waiting.add_metric([name], max(0.0, float(gpu["idle_waiting"])))
        busy.add_metric([name], max(0.0, float(gpu["busy"])))
    yield from (dispatched, swaps, busy, idle_waiting)


def _gpu_state(gpus: Sequence[dict[str, Any]]) -> Iterator[Metric]:
    """Each GPU now: its llama-swap at the last check, whether it may claim,
    and what holds it."""
    up = GaugeMetricFamily(
        "gpusched_upstream_up",
        "1 if the GPU's llama-swap answered the last check, 0 if not; absent before "
        "the first check.",
        labels=["gpu"],
    )
    resident = GaugeMetricFamily(
        "gpusched_upstream_resident_model_info",
        "The model the GPU's llama-swap had loaded at the last check.",
        labels=["gpu", "model"],
    )
    enabled = GaugeMetricFamily(
        "gpusched_gpu_enabled", "1 if the GPU may claim jobs, 0 if disabled.", labels=["gpu"]
    )
    # The holder watchdog's view (queueapp/services/running_long.py): the
    # seconds the longest-running of the GPU's jobs has held it, and
    # whether the watchdog reported that job.
    held = GaugeMetricFamily(
        "gpusched_gpu_held_seconds",
        "Seconds the GPU's current job has held it (the longest-running of its jobs; "
        "0 when idle), by the database's clock.",
        labels=["gpu"],
    )
    running_long = GaugeMetricFamily(
        "gpusched_gpu_running_long",
        "1 if the holder watchdog reported the GPU's current job as running long "
        f"(past {RUNNING_LONG_FACTOR:g} x its estimate and the policy's "
        "running_long_min_seconds), else 0.",
        labels=["gpu"],
    )
    for gpu in gpus:
        name = gpu["name"]
        held.add_metric([name], max(0.0, float(gpu["held_seconds"])))
        running_long.add_metric([name], 1.0 if gpu["running_long"] else 0.0)
        enabled.add_metric([name], 1.0 if gpu["enabled"] else 0.0)
        if gpu["checked"]:
            up.add_metric([name], 1.0 if gpu["reachable"] else 0.0)
            if gpu["resident_model"]:
                resident.add_metric([name, gpu["resident_model"]], 1.0)
    yield from (up, resident, enabled, held, running_long)


class GpuschedCollector(Collector):
    """Reads the queue's state from PostgreSQL on every collect()."""

    def collect(self) -> Iterator[Metric]:
        yield from self._queue()
        yield from self._decisions()
        yield from self._events()
        yield from self._upstream()
        yield from self._histograms()

    def _queue(self) -> Iterator[Metric]:
        depth = GaugeMetricFamily(
            "gpusched_queue_depth", "Queued jobs per priority band.", labels=["band"]
        )
        oldest = GaugeMetricFamily(
            "gpusched_queue_oldest_wait_seconds",
            "Seconds since the oldest queued job of the band was submitted (database clock).",
            labels=["band"],
        )
        # The wait is computed against the database's now(): the clock jobs age by.
        wait = ExpressionWrapper(Now() - Min("submitted_at"), output_field=DurationField())
        rows = (
            Job.objects.filter(status=JobStatus.QUEUED)
            .values("priority")
            .annotate(n=Count("id"), wait=wait)
            .order_by("priority")
        )
        for row in rows:
            depth.add_metric([str(row["priority"])], row["n"])
            oldest.add_metric([str(row["priority"])], max(row["wait"].total_seconds(), 0.0))
        # A query of its own so it can use the partial index on running jobs.
        in_flight = GaugeMetricFamily(
            "gpusched_model_in_flight",
            "Jobs of the model running now, per GPU (several share a GPU when the model's "
            "parallel allows).",
            labels=["model", "gpu"],
        )
        running = 0
        for model, gpu, n in (
            Job.objects.filter(status=JobStatus.RUNNING)
            .values_list("model", "gpu__name")
            .annotate(n=Count("id"))
            .order_by("model", "gpu__name")
        ):
            in_flight.add_metric([model, gpu or ""], n)
            running += n
        parallel = GaugeMetricFamily(
            "gpusched_model_parallel",
            "Jobs of the model one GPU may run at once (models without a setting: 1).",
            labels=["model"],
        )
        for model, slots in model_parallels().items():
            parallel.add_metric([model], slots)
        yield depth
        yield oldest
        yield GaugeMetricFamily("gpusched_running_jobs", "Jobs running now.", value=running)
        yield in_flight
        yield parallel

    def _decisions(self) -> Iterator[Metric]:
        dispatched = CounterMetricFamily(
            "gpusched_dispatched", "Jobs dispatched, per band of the chosen job.", labels=["band"]
        )
        changed = CounterMetricFamily(
            "gpusched_order_changed",
            "Dispatches whose choice would have been another job without this term.",
            labels=["term", "band"],
        )
        counts = {term: Count("id", filter=Q(**{f"changed_by_{term}": True})) for term in TERMS}
        rows = (
            DispatchDecision.objects.values("band")
            .annotate(
                n=Count("id"),
                swaps=Count("id", filter=Q(swap_needed=True)),
                borrowed=Count("id", filter=Q(borrowed=True)),
                **counts,
            )
            .order_by("band")
        )
        borrowed = CounterMetricFamily(
            "gpusched_borrowed_starts",
            "Jobs started past their member's running limit on a GPU no other job could use "
            "(work conservation), per band.",
            labels=["band"],
        )
        swaps = 0
        for row in rows:
            band = str(row["band"])
            dispatched.add_metric([band], row["n"])
            for term in TERMS:
                changed.add_metric([term, band], row[term])  # type: ignore[literal-required]  # annotated from TERMS
            swaps += row["swaps"]
            borrowed.add_metric([band], row["borrowed"])
        yield dispatched
        yield changed
        yield borrowed
        yield CounterMetricFamily(
            "gpusched_swaps", "Dispatches that needed a model swap.", value=swaps
        )

    def _events(self) -> Iterator[Metric]:
        # A failed job's event says whose failure it was (queueapp/dispatch/lease.py):
        # llama-swap's ("upstream"), the front door caller's ("caller"), or a
        # dispatcher that died too often ("lease").
        counts = (
            JobEvent.objects.filter(
                kind__in=[
                    JobEvent.Kind.FAILED,
                    JobEvent.Kind.RETURNED_TO_QUEUE,
                    JobEvent.Kind.EXPIRED,
                ]
            )
            .values_list(
                "kind",
                Coalesce(
                    KeyTextTransform("cause", "detail"), Value("other"), output_field=TextField()
                ),
            )
            .annotate(n=Count("id"))
            .order_by()
        )
        failed: dict[str, int] = {}
        returned = expired = 0
        for kind, cause, n in counts:
            if kind == JobEvent.Kind.FAILED:
                failed[cause] = n
            elif kind == JobEvent.Kind.EXPIRED:
                expired += n
            else:
                returned += n
        yield CounterMetricFamily(
            "gpusched_upstream_errors",
            "Jobs failed by llama-swap: an answer >= 400, an invalid one, or none at all.",
            value=failed.get("upstream", 0),
        )
        by_cause = CounterMetricFamily(
            "gpusched_jobs_failed",
            "Jobs failed, by cause: upstream (llama-swap), caller (a front-door caller hung "
            "up or went silent mid-call), lease (the dispatcher stopped too many times).",
            labels=["cause"],
        )
        for cause in sorted(set(failed) | {"upstream", "caller", "lease"}):
            by_cause.add_metric([cause], failed.get(cause, 0))
        yield by_cause
        yield CounterMetricFamily(
            "gpusched_jobs_expired",
            "Queued jobs that ended expired: their wait bound (X-Gpusched-Max-Wait, or the "
            "band's default) passed before they started.",
            value=expired,
        )
        yield CounterMetricFamily(
            "gpusched_returned_to_queue",
            "Claimed jobs put back in the queue before they ran.",
            value=returned,
        )

    def _upstream(self) -> Iterator[Metric]:
        """Per GPU: what it did, its llama-swap, and what holds it now (one query)."""
        gpus = _gpu_rows()
        yield from _gpu_work(gpus)
        yield from _gpu_state(gpus)

    def _histograms(self) -> Iterator[Metric]:
        duration = HistogramMetricFamily(
            "gpusched_job_duration_seconds",
            f"Run time (finished - started) of succeeded and failed jobs, preloads (a "
            f"model's load, not a run) left out. {WINDOW_NOTE}",
            labels=["model"],
        )
        job = Job._meta.db_table
        rows = _histogram(
            job,
            "extract(epoch FROM finished_at - started_at)",
            f"status IN (%s, %s) AND started_at IS NOT NULL "
            f"AND finished_at >= now() - interval '{WINDOW}' AND path NOT LIKE %s",
            [JobStatus.SUCCEEDED, JobStatus.FAILED, f"{PRELOAD_PATH_PREFIX}%"],
            DURATION_BUCKETS,
            group="model",
        )
        for model, counts, total in rows:
            duration.add_metric([model], _buckets(DURATION_BUCKETS, counts), total)
        yield duration

        gap = HistogramMetricFamily(
            "gpusched_dispatch_gap_seconds",
            f"Seconds the GPU stood idle before each dispatch. {WINDOW_NOTE}",
        )
        rows = _histogram(
            DispatchDecision._meta.db_table,
            "idle_seconds",
            f"idle_seconds IS NOT NULL AND at >= now() - interval '{WINDOW}'",
            [],
            GAP_BUCKETS,
            group="''",
        )
        # No rows still yields an all-zero histogram: a series that exists.
        counts, total = (rows[0][1], rows[0][2]) if rows else ([0] * (len(GAP_BUCKETS) + 1), 0.0)
        gap.add_metric([], _buckets(GAP_BUCKETS, counts), total)
        yield gap


REGISTRY = CollectorRegistry(auto_describe=False)  # no collect() (queries) at import
REGISTRY.register(GpuschedCollector())


@require_safe
def metrics_view(request: HttpRequest) -> HttpResponse:
    """The Prometheus text format; public, as it names no member."""
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)


# Included by gpusched/urls.py at "metrics", so the route is GET /metrics.
urlpatterns = [path("", metrics_view, name="metrics")]
