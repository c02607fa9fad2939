"""Jobs as the API, the webhooks, the pages and the live queue show them.

Plain functions from rows (and a forecast) to JSON-ready dicts. Links are
built from a `base_url` the caller names: the request's own site for an API
answer, `GPUSCHED_PUBLIC_URL` for a webhook, which has no request and whose
receiver follows links from elsewhere. Nothing here imports the API layer or
DRF, so the webhooks and the dispatcher, below the API, render a job the same
way the API does. Nothing here queries the database either: what is shown
(the job's webhook deliveries, the forecast) is passed in, so a list renders
with the reads its selector made, whatever its length.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from django.urls import reverse

from queueapp.models import DispatchDecision, Gpu, Job, JobStatus, WebhookDelivery, WebhookStatus
from queueapp.policy import TERMS
from queueapp.policy.expected import Basis, Expected
from queueapp.selectors import RunningJob
from queueapp.upstream.client import is_preload

if TYPE_CHECKING:
    from queueapp.queue_forecast import QueueForecast


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def absolute(base_url: str, path: str) -> str:
    """`path` on the site at `base_url` (an empty `base_url` leaves it relative)."""
    return base_url.rstrip("/") + path


def why_page_path(job_id: int) -> str:
    """The page that explains a job's wait, as every answer links it."""
    return reverse("job-why-page", args=[job_id])


def job_result(job: Job, *, base_url: str) -> dict[str, Any] | None:
    if job.result_status_code is None:
        return None
    url = None
    if job.result_file:
        url = absolute(base_url, reverse("api-job-result", args=[job.pk]))
    return {
        "status_code": job.result_status_code,
        "content_type": job.result_content_type,
        "body": job.result_body,
        "url": url,
    }


def job_chain(job: Job) -> dict[str, Any] | None:
    if not job.chain_id:
        return None
    return {"id": job.chain_id, "index": job.chain_index, "total": job.chain_total}


def job_output(
    job: Job,
    *,
    base_url: str,
    score: dict[str, Any] | None,
    estimate: dict[str, Any] | None,
    deliveries: Sequence[WebhookDelivery],
) -> dict[str, Any]:
    """`GET /api/jobs/{id}/` as DESIGN.md names it.

    `deliveries` are the job's webhook deliveries in id order, each with its
    `attempt_log` (selectors.job_webhook_log_load reads them for any number
    of jobs at once).
    """
    return {
        "id": job.pk,
        "status": job.status,
        "model": job.model,
        "path": job.path,
        "member": job.member.name,
        "priority_requested": job.priority_requested,
        "priority": job.priority,
        "score": score,
        "estimate": estimate,
        "submitted_at": _iso(job.submitted_at),
        "started_at": _iso(job.started_at),
        "finished_at": _iso(job.finished_at),
        "wait_deadline": _iso(job.wait_deadline),
        "gpu": gpu_name(job),
        "pinned_gpu": job.pinned_gpu or None,
        "swap": job.swap,
        "expected_seconds": job_expected(job).as_json(),
        "attempts": job.attempts,
        "result": job_result(job, base_url=base_url),
        "error": job.error or None,
        "caller_left_at": _iso(job.caller_left_at),
        "drained_seconds": job.drained_seconds,
        "callback_url": job.callback_url or None,
        "chain": job_chain(job),
        "body": job.body,
        "webhook": job_webhook(job, deliveries=deliveries),
        "links": {
            "why": absolute(base_url, reverse("api-job-why", args=[job.pk])),
            "why_page": absolute(base_url, why_page_path(job.pk)),
        },
    }


def job_expected(job: Job) -> Expected:
    """The expected run set on the job's row at its submission."""
    return Expected(
        job.expected_p50, job.expected_p90, Basis(job.expected_basis), job.size, job.size_text
    )


def job_webhook(job: Job, *, deliveries: Sequence[WebhookDelivery]) -> dict[str, Any] | None:
    """The callback and every delivery attempt (the delivery log)."""
    if not job.callback_url:
        return None
    return {
        "url": job.callback_url,
        "deliveries": [
            {
                "id": delivery.pk,
                "event": delivery.event_type,
                "webhook_id": delivery.webhook_id,
                "status": delivery.status,
                "attempts": [
                    {
                        "at": attempt.at.isoformat(),
                        "status_code": attempt.status_code,
                        "duration_ms": round(attempt.duration_ms or 0.0, 1),
                        "error": attempt.error or None,
                    }
                    for attempt in delivery.attempt_log.all()
                ],
                "next_attempt_at": delivery.next_attempt_at.isoformat()
                if delivery.status == WebhookStatus.PENDING
                else None,
                "delivered_at": _iso(delivery.delivered_at),
                "last_error": delivery.last_error or None,
            }
            for delivery in deliveries
        ],
    }


def job_score(job: Job, live_terms: dict[str, Any] | None) -> dict[str, Any] | None:
    """Live terms while queued; the terms it won with once dispatched."""
    if job.status == JobStatus.QUEUED and live_terms is not None:
        return {**live_terms, "as_of": "now"}
    if job.score_at_dispatch:
        return {**job.score_at_dispatch, "as_of": "dispatch"}
    return None


# Why an ETA is a guess, wherever it is shown.
GUESS_NOTE = (
    "a guess: a job that runs first has no estimate yet (nothing of its model learned, "
    "no typical run set), so its run is taken as a typical one"
)


def job_estimate(job_id: int, forecast: QueueForecast) -> dict[str, Any]:
    """Position and start time of a queued job, labelled as the estimate it is."""
    place = forecast.for_job(job_id)
    if place is None:
        return {
            "position": None,
            "start_at": None,
            "seconds_until_start": None,
            "dispatch_paused": forecast.paused,
            "note": f"more than {len(forecast.order)} jobs are expected to start first; "
            "no estimate that far ahead",
        }
    start = forecast.start_of(place)
    guess = forecast.is_guess(place)
    return {
        "position": place.position,
        "start_at": start.isoformat(),
        "seconds_until_start": round((start - forecast.now).total_seconds(), 1),
        "run_seconds": round(place.estimated_seconds, 1),
        "gpu": place.gpu,
        "dispatch_paused": forecast.paused,
        "basis": "guess" if guess else "learned",
        "note": GUESS_NOTE
        if guess
        else "estimate: the queue played forward with durations learned from finished "
        "jobs; new arrivals with a higher score move it back",
    }


def job_with_forecast(
    job: Job,
    *,
    base_url: str,
    forecast: QueueForecast | None,
    deliveries: Sequence[WebhookDelivery],
) -> dict[str, Any]:
    """A job with its score and estimate: a queued job's from `forecast`
    (which placed it, see eta.queue_forecast_for), another's as dispatched."""
    if job.status != JobStatus.QUEUED or forecast is None:
        return job_output(
            job, base_url=base_url, score=job_score(job, None), estimate=None, deliveries=deliveries
        )
    # A queued job the forecast did not load (too deep in its line) has no
    # live terms; its estimate says it is beyond the forecast.
    live = forecast.terms_now(job.pk) if job.pk in forecast.candidates else None
    return job_output(
        job,
        base_url=base_url,
        score=job_score(job, live),
        estimate=job_estimate(job.pk, forecast),
        deliveries=deliveries,
    )


def webhook_payload(
    job: Job,
    *,
    event: str,
    timestamp: datetime,
    base_url: str,
    deliveries: Sequence[WebhookDelivery],
) -> dict[str, Any]:
    """The body of a webhook event: the job as `GET /api/jobs/{id}/` shows it,
    with the terms it was dispatched with."""
    return {
        "type": event,
        "timestamp": timestamp.isoformat(),
        "data": job_output(
            job,
            base_url=base_url,
            score=job.score_at_dispatch,
            estimate=None,
            deliveries=deliveries,
        ),
    }


def queue_entry(job: Job, *, terms: dict[str, Any], position: int | None) -> dict[str, Any]:
    """A running or queued job in the queue view, names included (the
    dashboard redacts them per viewer)."""
    return {
        "id": job.pk,
        "position": position,
        "member_id": job.member_id,
        "member": job.member.name,
        "tier": job.member.tier.name,
        "model": job.model,
        "path": job.path,
        # A load, not a request: shown to everyone, as the model is.
        "preload": is_preload(job.path),
        "priority": job.priority,
        "chain": job_chain(job),
        "submitted_at": job.submitted_at.isoformat(),
        "started_at": _iso(job.started_at),
        "wait_deadline": _iso(job.wait_deadline),
        "gpu": gpu_name(job),
        "score": terms,
        "why": why_page_path(job.pk),
    }


def gpu_name(job: Job) -> str | None:
    """The GPU the job runs or ran on (load `gpu` with the job to save a query)."""
    return job.gpu.name if job.gpu_id is not None and job.gpu is not None else None


def gpu_entry(
    gpu: Gpu, *, running: Sequence[RunningJob], parallel: Mapping[str, int], staff: bool
) -> dict[str, Any]:
    """A GPU as `GET /api/gpus/` and the dashboard show it; its URL to staff
    only. `running`: its running jobs, by slot; `parallel`: the models'
    settings (a model without one runs one job at a time)."""
    running_job_ids = [job.id for job in running]
    # Without a dispatcher nothing follows its llama-swap: what the row says
    # was loaded is stale, and nothing is claimed there.
    followed = gpu.dispatcher_alive is not False
    entry: dict[str, Any] = {
        "name": gpu.name,
        "enabled": gpu.enabled,
        "health": gpu_health(gpu),
        "healthy": (gpu.reachable if gpu.checked_at else None) if followed else False,
        "dispatcher_alive": gpu.dispatcher_alive,
        "resident_model": (gpu.resident_model or None) if followed else None,
        "resident_models": list(gpu.resident_models) if followed else [],
        "loading_models": list(gpu.loading_models) if followed else [],
        "foreign_in_flight": gpu.foreign_in_flight,
        "running_job": running_job_ids[0] if running_job_ids else None,
        "running_jobs": running_job_ids,
        # Co-resident models run side by side: how many jobs of each, now.
        "busy_models": busy_models(running),
        # Jobs of the loaded model it may run at once, and those it runs.
        "slots": parallel.get(gpu.resident_model, 1) if followed else 1,
        "slots_in_use": len(running_job_ids),
        "models": gpu.runs_models(),
        "served_models": gpu.served_models,
        "allowed_models": list(gpu.allowed_models) or None,
        "reservation": {
            "min_band": gpu.min_band,
            "max_expected_seconds": gpu.max_expected_seconds,
        }
        if gpu.reserved
        else None,
        "checked_at": _iso(gpu.checked_at),
        "error": gpu.error or None,
        "config_models": gpu.config_models,
        "routing_error": gpu.routing_error or None,
        "one_model_at_a_time": gpu.one_model_at_a_time,
    }
    if staff:
        entry["url"] = gpu.url
    return entry


class GpuHealth(StrEnum):
    """A GPU's health in words, as `gpu_entry`'s `health` says it."""

    DISABLED = "disabled"
    NO_DISPATCHER = "no dispatcher"
    NOT_CHECKED = "not checked yet"
    HEALTHY = "healthy"
    DOWN = "down"


def gpu_health(gpu: Gpu) -> str:
    """`GpuHealth` of a row `selectors.gpus_list` read: disabled first (the
    operator's choice), then a dispatcher gone, then its llama-swap's
    answer to the last check."""
    if not gpu.enabled:
        return GpuHealth.DISABLED
    if gpu.dispatcher_alive is False:
        return GpuHealth.NO_DISPATCHER
    if gpu.checked_at is None:
        return GpuHealth.NOT_CHECKED
    return GpuHealth.HEALTHY if gpu.reachable else GpuHealth.DOWN


def busy_models(running: Sequence[RunningJob]) -> dict[str, int]:
    """Per model, its jobs in `running`, the model names sorted."""
    counts = Counter(job.model for job in running)
    return {model: counts[model] for model in sorted(counts)}


def decision_entry(decision: DispatchDecision) -> dict[str, Any]:
    """A recent dispatch in the queue view, names included."""
    return {
        "at": decision.at.isoformat(),
        "job": decision.job_id,
        "member_id": decision.job.member_id,
        "member": decision.job.member.name,
        "model": decision.job.model,
        "gpu": decision.gpu.name if decision.gpu is not None else None,
        "band": decision.band,
        "effective": decision.terms.get("effective"),
        "swap_needed": decision.swap_needed,
        "changed_by": [term for term in TERMS if getattr(decision, f"changed_by_{term}")],
    }
