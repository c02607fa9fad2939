"""The gateway hears what became of its callers' jobs from the jobs table's
trigger (migration 0012), and reads the grant from the notice alone: these
tests claim and cancel real jobs and parse the notices PostgreSQL sends."""

from __future__ import annotations

import psycopg
import pytest

from queueapp import gateways, services
from queueapp.dispatch import claim as claim_module
from queueapp.dispatch.claim import ClaimedJob, job_claim_next
from queueapp.frontdoor.gateway import Grant
from queueapp.locks import GATEWAY_LOCK_CLASS
from queueapp.models import JobStatus
from tests import factories
from tests.frontdoor.conftest import GATEWAY

pytestmark = pytest.mark.django_db(transaction=True)

NOTICE_TIMEOUT_S = 10.0


def front_door_job(owner, model: str = "chat-small"):
    return services.job_submit(
        member=owner,
        path="/v1/chat/completions",
        body=factories.chat_body(model),
        model=model,
        priority_header=None,
        front_door=True,
        gateway=GATEWAY,
    )


def next_notice(session: psycopg.Connection) -> list[str]:
    for notice in session.notifies(timeout=NOTICE_TIMEOUT_S):
        return notice.payload.split(" ")
    raise AssertionError(f"no notice within {NOTICE_TIMEOUT_S} s")


def test_a_grant_notice_carries_the_claim_the_caller_needs(default_tiers, gateway_session):
    ann, _ = factories.member("ann", "pro")
    job = front_door_job(ann)
    claim = job_claim_next(resident_model=None, worker="test")
    assert isinstance(claim, ClaimedJob) and claim.job_id == job.pk

    grant = Grant.from_notice(next_notice(gateway_session), path=job.path, model=job.model)

    assert grant.status == JobStatus.RUNNING
    assert grant.claim is not None
    assert grant.claim.job_id == job.pk
    assert grant.claim.claim_token == claim.claim_token
    assert grant.claim.lease_seconds == claim.lease_seconds
    assert grant.claim.effective_score == pytest.approx(claim.effective_score)
    job.refresh_from_db()
    assert job.lease_expires_at is not None
    assert grant.lease_expires_at == pytest.approx(job.lease_expires_at.timestamp(), abs=1e-3)


def test_a_cancelled_job_is_a_notice_without_a_claim(default_tiers, gateway_session):
    ann, _ = factories.member("ann", "pro")
    job = front_door_job(ann)

    services.job_cancel(job=job, by="ann")

    grant = Grant.from_notice(next_notice(gateway_session))
    assert grant.status == JobStatus.CANCELLED
    assert grant.claim is None


def test_a_job_of_a_gateway_without_its_lock_is_never_granted(
    default_tiers, gateway_session, gateways_judged
):
    ann, _ = factories.member("ann", "pro")
    gateway_session.execute("SELECT pg_advisory_unlock(%s, %s)", [GATEWAY_LOCK_CLASS, GATEWAY])
    job = front_door_job(ann)

    claim = job_claim_next(resident_model=None, worker="test")

    assert not isinstance(claim, ClaimedJob)
    job.refresh_from_db()
    assert job.status != JobStatus.RUNNING


def test_right_after_postgresql_starts_no_gateway_is_judged_gone(
    default_tiers, gateway_session, monkeypatch
):
    """Every listener is still reconnecting then: a job of a gateway without
    its lock is neither cancelled nor refused its grant during the grace."""
    # As if the grace were a century: the server has always "just started".
    within_grace = "pg_postmaster_start_time() < now() - interval '100 years'"
    monkeypatch.setattr(gateways, "JUDGING_SQL", within_grace)
    monkeypatch.setattr(claim_module, "JUDGING_SQL", within_grace)
    ann, _ = factories.member("ann", "pro")
    gateway_session.execute("SELECT pg_advisory_unlock(%s, %s)", [GATEWAY_LOCK_CLASS, GATEWAY])
    job = front_door_job(ann)

    assert services.front_door_orphans_cancel() == 0
    claim = job_claim_next(resident_model=None, worker="test")
    assert isinstance(claim, ClaimedJob) and claim.job_id == job.pk
