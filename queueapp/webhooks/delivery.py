"""Delivering webhooks: outside the GPU worker, persistent, retried.

A delivery row is written in the transaction that ends the job, so an event
is never lost and never sent for a rolled-back change. Workers of the
`webhooks` django-q2 cluster take due deliveries one at a time (SKIP LOCKED),
push the due time forward before sending (a worker killed mid-attempt leaves
it due again), send with no transaction open, and record the attempt.

A cluster of their own, because a delivery must never wait behind a long GPU
job nor hold up a dispatch. Retries follow WEBHOOK_RETRY_SCHEDULE with
jitter; a receiver's longer Retry-After wins, up to the schedule's longest
pause. An every-minute schedule (migration 0009) picks up what a pass or a
restart left behind.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from datetime import UTC, datetime, timedelta
from urllib.parse import urlsplit, urlunsplit

import httpx
from django.conf import settings
from django.db import transaction
from standardwebhooks import Webhook

from queueapp.dispatch import wakeup
from queueapp.http_headers import http_date, retry_after_seconds
from queueapp.models import (
    DisabledCallback,
    Job,
    WebhookAttempt,
    WebhookDelivery,
    WebhookStatus,
)
from queueapp.rendering import webhook_payload
from queueapp.selectors import db_now, jobs_with_webhooks
from queueapp.webhooks.ssrf import HostNotResolved, RefusedAddress, resolve_allowed

EVENTS = {
    "succeeded": "job.succeeded",
    "failed": "job.failed",
    "cancelled": "job.cancelled",
    "expired": "job.expired",
}
# How long a worker may hold a delivery it took before another may retry it.
TAKE_SECONDS = 60.0


def webhook_enqueue(*, job: Job) -> WebhookDelivery | None:
    """In the transaction that ends `job`: the event for its callback URL."""
    if not job.callback_url or job.status not in EVENTS:
        return None
    # Links the receiver can follow from elsewhere: the public site's.
    payload = webhook_payload(
        job,
        event=EVENTS[job.status],
        timestamp=db_now(),
        base_url=settings.GPUSCHED_PUBLIC_URL,
        deliveries=jobs_with_webhooks([job]).webhook_log(job.pk),
    )
    delivery = WebhookDelivery.objects.create(
        job=job,
        event_type=EVENTS[job.status],
        webhook_id=f"msg_{uuid.uuid4().hex}",
        url=job.callback_url,
        payload=payload,
    )
    if DisabledCallback.objects.filter(member_id=job.member_id, url=job.callback_url).exists():
        delivery.status = WebhookStatus.DISABLED
        delivery.last_error = "the receiver answered 410 Gone earlier; this URL is disabled"
        delivery.save(update_fields=["status", "last_error"])
        return delivery
    transaction.on_commit(kick)
    return delivery


def kick() -> None:
    wakeup.kick(wakeup.WEBHOOK_CLUSTER, wakeup.DELIVER_TASK)


def _take_due() -> WebhookDelivery | None:
    with transaction.atomic(durable=True):
        delivery = (
            WebhookDelivery.objects.select_for_update(skip_locked=True)
            .select_related("job__member")
            .filter(status=WebhookStatus.PENDING, next_attempt_at__lte=db_now())
            .order_by("next_attempt_at", "id")
            .first()
        )
        if delivery is not None:
            delivery.next_attempt_at = db_now() + timedelta(seconds=TAKE_SECONDS)
            delivery.save(update_fields=["next_attempt_at"])
        return delivery


def deliver_due(*, budget_seconds: float = 50.0) -> int:
    """Send due deliveries one at a time, waiting for retries that fall due
    within the budget; returns how many were attempted."""
    deadline = time.monotonic() + budget_seconds
    attempted = 0
    while time.monotonic() < deadline and not wakeup.STOP_REQUESTED.is_set():
        delivery = _take_due()
        if delivery is not None:
            _attempt(delivery)
            attempted += 1
            continue
        upcoming = (
            WebhookDelivery.objects.filter(status=WebhookStatus.PENDING)
            .order_by("next_attempt_at")
            .values_list("next_attempt_at", flat=True)
            .first()
        )
        if upcoming is None:
            return attempted
        wait = (upcoming - db_now()).total_seconds()
        if wait > deadline - time.monotonic():
            return attempted  # the every-minute schedule comes back for it
        wakeup.STOP_REQUESTED.wait(max(0.05, wait))
    if not wakeup.STOP_REQUESTED.is_set():
        kick()
    return attempted


def _send(delivery: WebhookDelivery) -> httpx.Response:
    body = json.dumps(delivery.payload, separators=(",", ":"))
    signed_at = db_now()
    signature = Webhook(delivery.job.member.webhook_secret).sign(
        delivery.webhook_id, signed_at, body
    )
    parts = urlsplit(delivery.url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    address = resolve_allowed(parts.hostname or "", port)
    # Connect to the address that passed the check, not to a fresh lookup.
    host = f"[{address}]" if ":" in address else address
    pinned = urlunsplit((parts.scheme, f"{host}:{port}", parts.path or "/", parts.query, ""))
    headers = {
        "Content-Type": "application/json",
        "Host": parts.netloc.rsplit("@", 1)[-1],
        "webhook-id": delivery.webhook_id,
        "webhook-timestamp": str(int(signed_at.timestamp())),
        "webhook-signature": signature,
        "User-Agent": "gpusched-webhooks",
    }
    with httpx.Client(timeout=settings.WEBHOOK_TIMEOUT_SECONDS, follow_redirects=False) as client:
        return client.post(
            pinned,
            content=body,
            headers=headers,
            extensions={"sni_hostname": parts.hostname} if parts.scheme == "https" else None,
        )


def _attempt(delivery: WebhookDelivery) -> None:
    started = time.monotonic()
    status_code, error, retry_after, refused = None, "", None, False
    try:
        response = _send(delivery)
        status_code = response.status_code
        if 300 <= status_code < 400:
            error = f"the receiver answered {status_code} (redirects are not followed)"
        elif not 200 <= status_code < 300:
            error = f"the receiver answered {status_code}"
        if error:
            retry_after = retry_after_seconds(
                response.headers.get("retry-after"), now=_answered_at(response)
            )
    except RefusedAddress as exc:
        error, refused = f"refused: {exc}", True
    except (HostNotResolved, httpx.HTTPError) as exc:
        # A DNS failure is usually temporary: retried like a refused connection.
        error = f"{type(exc).__name__}: {exc}"
    duration_ms = (time.monotonic() - started) * 1000
    with transaction.atomic(durable=True):
        delivery = WebhookDelivery.objects.select_for_update().get(pk=delivery.pk)
        delivery.attempts += 1
        WebhookAttempt.objects.create(
            delivery=delivery, status_code=status_code, duration_ms=duration_ms, error=error
        )
        now = db_now()
        if status_code is not None and 200 <= status_code < 300:
            delivery.status = WebhookStatus.DELIVERED
            delivery.delivered_at, delivery.last_error = now, ""
        elif status_code == 410:
            delivery.status = WebhookStatus.DISABLED
            delivery.last_error = "410 Gone: the receiver asked for no more deliveries to this URL"
            DisabledCallback.objects.get_or_create(
                member_id=delivery.job.member_id, url=delivery.url
            )
        elif refused:
            delivery.status, delivery.last_error = WebhookStatus.FAILED, error
        else:
            delivery.last_error = error
            pause = _next_pause(delivery.attempts, retry_after)
            if pause is None:
                delivery.status = WebhookStatus.FAILED
            else:
                delivery.next_attempt_at = now + timedelta(seconds=pause)
        delivery.save()


def _next_pause(attempts_made: int, retry_after: float | None) -> float | None:
    """Seconds until the next attempt (schedule with ±10 % jitter, so receivers
    that failed together are not retried together), None when spent.

    A longer Retry-After wins, up to the schedule's longest pause: a receiver
    cannot park a delivery for ever.
    """
    schedule = settings.WEBHOOK_RETRY_SCHEDULE
    if attempts_made > len(schedule):
        return None
    pause = schedule[attempts_made - 1] * random.uniform(0.9, 1.1)
    return max(pause, min(retry_after or 0.0, max(schedule)))


def _answered_at(response: httpx.Response) -> datetime:
    """The receiver's own clock when it sent a Date header (an HTTP-date
    Retry-After is on that clock), else ours."""
    return http_date(response.headers.get("date")) or datetime.now(UTC)


@transaction.atomic(durable=True)
def webhook_redeliver(*, delivery: WebhookDelivery) -> WebhookDelivery:
    """Send an event again (same webhook-id, so receivers can de-duplicate)."""
    delivery = WebhookDelivery.objects.select_for_update().get(pk=delivery.pk)
    DisabledCallback.objects.filter(member_id=delivery.job.member_id, url=delivery.url).delete()
    delivery.status = WebhookStatus.PENDING
    delivery.next_attempt_at = db_now()
    delivery.save(update_fields=["status", "next_attempt_at"])
    transaction.on_commit(kick)
    return delivery
