"""A job dispatched more than once counts once in another job's wait; the time
llama-swap refused it is a part of its own. Real claims, returns and finishes,
each in its own transaction (so each has its own database clock)."""

import json

import pytest

from queueapp.dispatch.claim import job_claim_next
from queueapp.dispatch.lease import job_end_durable, job_return_to_queue
from queueapp.models import DispatchDecision, Job
from queueapp.upstream.client import UpstreamAnswer
from tests import factories

pytestmark = pytest.mark.django_db(transaction=True)

OK = UpstreamAnswer(200, "application/json", json.dumps({"ok": True}).encode(), None)


def claim_next(expected: Job):
    claim = job_claim_next(resident_model="chat-small", worker="test")
    assert claim.job_id == expected.pk
    return claim


def test_a_job_refused_once_then_run_counts_once_and_the_refusal_is_its_own_part(
    api, default_tiers
):
    ann, ann_token = factories.member("ann", "free")
    bob, _ = factories.member("bob-othermember", "free")
    waiting = factories.job(ann, priority="batch")
    ahead = factories.job(bob, priority="normal")

    refused = claim_next(ahead)
    assert job_return_to_queue(claim=refused, reason="llama-swap unreachable")
    rerun = claim_next(ahead)
    assert job_end_durable(claim=rerun, answer=OK, error=None, inline_limit=4096)
    claim_next(waiting)

    answer = api.as_member(ann_token).get(f"/api/jobs/{waiting.pk}/why/").json()
    first, second = DispatchDecision.objects.filter(job=ahead).order_by("at")
    ahead.refresh_from_db()
    waiting.refresh_from_db()

    runs = [p for p in answer["parts"] if p["kind"] == "dispatched_ahead"]
    assert [p["job"]["id"] for p in runs] == [ahead.pk], answer["parts"]
    run = (ahead.finished_at - ahead.started_at).total_seconds()
    assert runs[0]["seconds"] + runs[0]["swap_seconds"] == pytest.approx(run, abs=0.002)

    (away,) = [p for p in answer["parts"] if p["kind"] == "upstream_unavailable"]
    assert (away["from"], away["to"]) == (first.at.isoformat(), second.at.isoformat())
    assert "llama-swap unreachable" in away["reason"]
    assert away["job"]["member"] is None  # another member's job, seen by a non-staff owner

    measured = (waiting.started_at - waiting.submitted_at).total_seconds()
    assert answer["measured_wait_seconds"] == pytest.approx(measured, abs=0.002)
    assert answer["parts_total_seconds"] == pytest.approx(measured, abs=0.005)
    assert "bob-othermember" not in json.dumps(answer)


def test_the_why_page_draws_the_whole_life_of_a_finished_job(client, default_tiers):
    ann, token = factories.member("ann", "free")
    bob, _ = factories.member("bob", "free")
    waiting = factories.job(ann, priority="batch")
    ahead = factories.job(bob)
    assert job_end_durable(claim=claim_next(ahead), answer=OK, error=None, inline_limit=4096)
    assert job_end_durable(claim=claim_next(waiting), answer=OK, error=None, inline_limit=4096)

    client.post("/login/", {"token": token})
    page = client.get(f"/jobs/{waiting.pk}/why/").content.decode()
    markers = [
        label for label in ("submitted", "started", "finished") if f'data-label="{label}"' in page
    ]
    assert markers == ["submitted", "started", "finished"]
    assert 'data-kind="dispatched_ahead"' in page and 'data-kind="own_run"' in page
