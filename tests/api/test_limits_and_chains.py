"""Per-tier queue limits, chains with progress, and queued jobs' estimates."""

from datetime import timedelta

import pytest

from queueapp.models import Job, JobStatus, RunStats, Tier
from queueapp.selectors import db_now
from tests import factories
from tests.factories import submit

pytestmark = pytest.mark.django_db


def test_queue_limit_answers_429_with_retry_after_and_the_numbers(api, default_tiers):
    Tier.objects.filter(name="free").update(max_queued_jobs=2)
    _, token = factories.member("ann", "free")
    assert submit(api, token).status_code == 201
    assert submit(api, token).status_code == 201
    refused = submit(api, token)
    assert refused.status_code == 429
    assert int(refused["Retry-After"]) >= 1
    assert "ann has 2 jobs queued; tier free allows 2" in refused.json()["detail"]
    assert Job.objects.count() == 2
    # A started job frees a place.
    Job.objects.filter(pk=Job.objects.order_by("id").first().pk).update(status=JobStatus.RUNNING)
    assert submit(api, token).status_code == 201


def test_chains_show_progress_and_cancel_their_queued_units(api, default_tiers):
    owner, token = factories.member("ann", "pro")
    for index in range(4):
        response = submit(api, token, chain={"id": "film-1", "index": index, "total": 10})
        assert response.status_code == 201
    first, second = Job.objects.filter(chain_id="film-1").order_by("id")[:2]
    start = first.submitted_at
    Job.objects.filter(pk=first.pk).update(
        status=JobStatus.SUCCEEDED,
        started_at=start,
        finished_at=start + timedelta(seconds=240),
    )
    Job.objects.filter(pk=second.pk).update(status=JobStatus.RUNNING, started_at=start)
    chains = api.as_member(token).get("/api/chains/").json()["results"]
    assert len(chains) == 1
    film = chains[0]
    assert (film["id"], film["total"], film["done"], film["running"], film["queued"]) == (
        "film-1",
        10,
        1,
        1,
        2,
    )
    assert film["time_used_seconds"] >= 240
    assert film["estimate"]["seconds_per_unit"] == 240
    assert film["estimate"]["seconds_left"] == 9 * 240
    assert api.as_member(token).get("/api/chains/film-1/").json()["done"] == 1

    _, other = factories.member("bob", "free")
    assert api.as_member(other).get("/api/chains/film-1/").status_code == 404
    assert api.as_member(other).delete("/api/chains/film-1/").status_code == 404

    cancelled = api.as_member(token).delete("/api/chains/film-1/")
    assert cancelled.json() == {"id": "film-1", "cancelled": 2}
    statuses = sorted(Job.objects.filter(chain_id="film-1").values_list("status", flat=True))
    assert statuses == ["cancelled", "cancelled", "running", "succeeded"]


def test_a_queued_job_shows_its_position_and_estimated_start(api, default_tiers):
    RunStats.objects.create(model="chat-small", path="/v1/chat/completions", warm_seconds=30)
    owner, token = factories.member("ann", "free")
    for _ in range(3):
        factories.job(owner, priority="normal")
    mine = submit(api, token).json()
    estimate = mine["estimate"]
    assert estimate["position"] == 4
    assert estimate["seconds_until_start"] == pytest.approx(90, abs=1)
    assert estimate["run_seconds"] == 30
    assert "estimate" in estimate["note"]
    queue = api.as_member(token).get("/api/queue/").json()
    assert [entry["position"] for entry in queue["queued"]] == [1, 2, 3, 4]
    assert all(entry["estimated_start_at"] for entry in queue["queued"])


def test_requeue_puts_a_failed_job_back_as_new(default_tiers):
    from queueapp import services

    owner, _ = factories.member("ann", "free")
    job = factories.job(owner)
    an_hour_ago = job.submitted_at - timedelta(hours=1)
    Job.objects.filter(pk=job.pk).update(
        status=JobStatus.FAILED, error="boom", attempts=3, submitted_at=an_hour_ago
    )
    again = services.job_requeue(job=Job.objects.get(pk=job.pk), by="admin")
    assert (again.status, again.error, again.attempts) == ("queued", "", 0)
    assert again.submitted_at == again.eligible_at == db_now()
    assert list(again.events.values_list("kind", flat=True)) == ["submitted", "requeued"]


def test_a_job_beyond_the_forecast_horizon_says_so(api, default_tiers, monkeypatch):
    monkeypatch.setattr("queueapp.eta.FORECAST_HORIZON", 2)
    owner, token = factories.member("ann", "free")
    for _ in range(3):
        factories.job(owner, priority="interactive")
    estimate = submit(api, token).json()["estimate"]
    assert estimate["position"] is None and estimate["start_at"] is None
    assert "more than 2 jobs" in estimate["note"]
