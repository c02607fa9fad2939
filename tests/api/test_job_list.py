"""`GET /api/jobs/`: one read of the page, one forecast, each job as its own view shows it."""

from datetime import UTC, datetime

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from queueapp import services
from queueapp.dispatch.claim import job_claim_next
from queueapp.models import WebhookAttempt
from tests import factories

pytestmark = pytest.mark.django_db


@pytest.fixture
def frozen_clock(monkeypatch):
    """One database instant for every answer, so two answers can be compared
    whole (the estimates and the aging count from it)."""
    instant = datetime.now(UTC)
    monkeypatch.setattr("queueapp.eta.db_now", lambda: instant)
    return instant


def cancelled_with_deliveries(owner, *, attempts: int):
    """A job whose callback got the `job.cancelled` event, tried `attempts` times."""
    job = factories.job(owner, callback_url="https://receiver.example/hook")
    services.job_cancel(job=job, by=owner.name)
    delivery = job.webhooks.get()
    for number in range(attempts):
        WebhookAttempt.objects.create(
            delivery=delivery, status_code=500, duration_ms=10.0 + number, error="the receiver"
        )
    return job


def test_the_list_shows_every_job_as_its_own_view_does(api, default_tiers, frozen_clock):
    ann, token = factories.member("ann", "pro")
    bob, _ = factories.member("bob", "max")
    # Several queue lines: bands, models and another member's jobs ahead.
    for priority in ("interactive", None, "batch"):
        factories.job(bob, priority=priority)
    for priority, model in [
        ("batch", "chat-small"),
        (None, "chat-large"),
        ("interactive", "chat-small"),
        (None, "chat-small"),
        ("batch", "chat-large"),
        (None, "chat-large"),
    ]:
        factories.job(ann, priority=priority, model=model)
    running = job_claim_next(resident_model=None, worker="test")
    assert running is not None
    cancelled_with_deliveries(ann, attempts=2)

    listed = api.as_member(token).get("/api/jobs/")
    assert listed.status_code == 200
    results = listed.json()["results"]
    queued = [job for job in results if job["status"] == "queued"]
    assert len(queued) >= 5
    assert {job["estimate"]["position"] for job in queued} != {None}
    for job in results:
        alone = api.get(f"/api/jobs/{job['id']}/")
        assert alone.status_code == 200
        assert job == alone.json()


def test_the_list_of_queued_jobs_keeps_the_status_filter(api, default_tiers, frozen_clock):
    ann, token = factories.member("ann")
    kept = [factories.job(ann), factories.job(ann, model="chat-large")]
    cancelled_with_deliveries(ann, attempts=1)
    results = api.as_member(token).get("/api/jobs/?status=queued").json()["results"]
    assert [job["id"] for job in results] == [job.pk for job in reversed(kept)]
    assert [job["estimate"]["position"] for job in results] == [2, 1]


def queries_of_the_list(api, token) -> int:
    with CaptureQueriesContext(connection) as captured:
        response = api.as_member(token).get("/api/jobs/")
    assert response.status_code == 200
    return len(captured)


def test_the_list_reads_as_many_times_for_many_jobs_as_for_few(api, default_tiers):
    few, few_token = factories.member("few")
    many, many_token = factories.member("many")
    lines = [("batch", "chat-small"), (None, "chat-large"), ("interactive", "chat-small")]
    for priority, model in lines:
        factories.job(few, priority=priority, model=model)
    cancelled_with_deliveries(few, attempts=1)
    for _ in range(8):
        for priority, model in lines:
            factories.job(many, priority=priority, model=model)
    for attempts in range(1, 6):
        cancelled_with_deliveries(many, attempts=attempts)

    assert queries_of_the_list(api, many_token) == queries_of_the_list(api, few_token)
