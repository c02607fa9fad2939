"""The gateway hears what became of its callers' jobs from the jobs table's
trigger (queueapp/sql/job_notify.sql), and reads the grant from the notice
alone: these tests claim and cancel real jobs and parse the notices
PostgreSQL sends."""

from __future__ import annotations

from dataclasses import asdict

import psycopg
import pytest

from queueapp import liveness, services
from queueapp.dispatch import snapshot as claim_snapshot
from queueapp.dispatch.claim import ClaimedJob, job_claim_next
from queueapp.frontdoor.gateway import Grant, _ended_or_granted
from queueapp.job_notices import GatewayNotice
from queueapp.locks import GATEWAY_LOCK_CLASS
from queueapp.models import Job, JobStatus
from tests import factories
from tests.frontdoor.conftest import GATEWAY

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.database_server]

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


def next_notices(session: psycopg.Connection, count: int) -> list[GatewayNotice]:
    # Read as one batch: notices that arrive together and are not read by
    # the generator that received them are lost.
    heard = [n.payload for n in session.notifies(timeout=NOTICE_TIMEOUT_S, stop_after=count)]
    assert len(heard) == count, f"{heard} within {NOTICE_TIMEOUT_S} s, {count} expected"
    return [GatewayNotice.parse(payload) for payload in heard]


def next_notice(session: psycopg.Connection) -> GatewayNotice:
    return next_notices(session, 1)[0]


def test_a_grant_notice_carries_the_claim_the_caller_needs(default_tiers, gateway_session):
    ann, _ = factories.member("ann", "pro")
    job = front_door_job(ann)
    claim = job_claim_next(resident_model=None, worker="test")
    assert isinstance(claim, ClaimedJob) and claim.job_id == job.pk

    grant = Grant.from_notice(next_notice(gateway_session))

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


def test_every_gateway_notice_parses_as_the_job_it_is_about(default_tiers, gateway_session):
    """Granted, cancelled, failed before it ran: the trigger's notice of each
    is what housekeeping rebuilds from the job's row when a notice is lost."""
    ann, _ = factories.member("ann", "pro")
    granted, cancelled, failed = (front_door_job(ann) for _ in range(3))
    claim = job_claim_next(resident_model=None, worker="test")
    assert isinstance(claim, ClaimedJob) and claim.job_id == granted.pk
    services.job_cancel(job=cancelled, by="ann")
    # Any writer's change is announced, raw SQL included.
    Job.objects.filter(pk=failed.pk).update(status=JobStatus.FAILED, error="no such model")

    notices = next_notices(gateway_session, 3)

    assert [(notice.job, notice.status) for notice in notices] == [
        (granted.pk, JobStatus.RUNNING),
        (cancelled.pk, JobStatus.CANCELLED),
        (failed.pk, JobStatus.FAILED),
    ]
    rebuilt = _ended_or_granted([granted.pk, cancelled.pk, failed.pk])
    for notice in notices:
        assert asdict(notice) == pytest.approx(asdict(_about(rebuilt, notice.job)))
    running = notices[0]
    assert running.claim_token == claim.claim_token
    assert running.gpu is not None and running.gpu == claim.gpu_id
    assert running.lease_seconds == pytest.approx(claim.lease_seconds)
    assert running.effective_score == pytest.approx(claim.effective_score)
    for ended in notices[1:]:
        assert (ended.claim_token, ended.lease_seconds, ended.lease_expires_at) == (None,) * 3


def _about(notices: list[GatewayNotice], job_id: int) -> GatewayNotice:
    return next(notice for notice in notices if notice.job == job_id)


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
    monkeypatch.setattr(liveness, "JUDGING_SQL", within_grace)
    monkeypatch.setattr(claim_snapshot, "JUDGING_SQL", within_grace)
    ann, _ = factories.member("ann", "pro")
    gateway_session.execute("SELECT pg_advisory_unlock(%s, %s)", [GATEWAY_LOCK_CLASS, GATEWAY])
    job = front_door_job(ann)

    assert services.front_door_orphans_cancel() == 0
    claim = job_claim_next(resident_model=None, worker="test")
    assert isinstance(claim, ClaimedJob) and claim.job_id == job.pk
