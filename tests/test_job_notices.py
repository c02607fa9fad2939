"""The jobs table's trigger (queueapp/sql/job_notify.sql) and the one parser of
its notices (queueapp/job_notices.py), held together: real job changes in
PostgreSQL, every notice heard on the work channel parsed and compared with
the change that sent it. The gateway channel's notices are checked the same
way in tests/frontdoor/test_gateway_notices.py."""

from __future__ import annotations

import json

import psycopg
import pytest
from django.db import transaction

from queueapp import services
from queueapp.dispatch.claim import ClaimedJob, job_claim_next
from queueapp.dispatch.lease import job_end_durable
from queueapp.dispatch.wakeup import work_available
from queueapp.job_notices import WORK_CHANNEL, GatewayNotice, WorkChange, WorkNotice
from queueapp.live.events import listener_connection_params
from queueapp.models import Job, JobStatus
from queueapp.upstream.client import UpstreamAnswer
from tests import factories

pytestmark = pytest.mark.database_server

HEARD_WITHIN_S = 10.0  # a notification committed now arrives well within this
# Notified after the changes: on one connection, notices of every channel
# arrive in commit order, so this one comes after every notice they sent.
END_OF_CHANGES = "test_job_notices_end"


def heard_until_end(session: psycopg.Connection) -> list[str]:
    """The work channel's payloads, in order, up to END_OF_CHANGES."""
    with psycopg.connect(**listener_connection_params(), autocommit=True) as other:
        other.execute(f"NOTIFY {END_OF_CHANGES}")
    heard: list[str] = []
    for notice in session.notifies(timeout=HEARD_WITHIN_S):
        if notice.channel == END_OF_CHANGES:
            return heard
        heard.append(notice.payload)
    raise AssertionError(f"no end of the changes within {HEARD_WITHIN_S} s; heard {heard}")


def claim_on(gpu: int) -> ClaimedJob:
    claim = job_claim_next(resident_model=None, worker="test", gpu=gpu)
    assert isinstance(claim, ClaimedJob)
    return claim


@pytest.mark.django_db(transaction=True)
def test_every_work_notice_of_a_jobs_life_parses_as_what_happened(default_tiers):
    ann, _ = factories.member("ann", "pro")
    gpu = services.gpu_register(name="gpu0", url="http://127.0.0.1:9").pk
    with psycopg.connect(**listener_connection_params(), autocommit=True) as session:
        session.execute(f"LISTEN {WORK_CHANNEL}")
        session.execute(f"LISTEN {END_OF_CHANGES}")

        job = factories.job(ann)
        job_end_durable(claim=claim_on(gpu), answer=None, error="refused", inline_limit=0)
        job.refresh_from_db()
        assert job.status == JobStatus.FAILED
        services.job_requeue(job=job, by="ann")
        job_end_durable(
            claim=claim_on(gpu),
            answer=UpstreamAnswer(200, "application/json", b"{}", None),
            error=None,
            inline_limit=1000,
        )
        with transaction.atomic():
            work_available()

        notices = [WorkNotice.parse(payload) for payload in heard_until_end(session)]

    # `other` is work_available's, which services send beside the trigger's.
    assert [notice for notice in notices if notice.change != WorkChange.OTHER] == [
        WorkNotice(WorkChange.QUEUED),
        WorkNotice(WorkChange.GRANTED, gpu),
        WorkNotice(WorkChange.FREED, gpu),
        WorkNotice(WorkChange.QUEUED),
        WorkNotice(WorkChange.GRANTED, gpu),
        WorkNotice(WorkChange.FREED, gpu),
    ]
    assert notices[-1] == WorkNotice(WorkChange.OTHER)


@pytest.mark.django_db(transaction=True)
def test_jobs_requeued_in_one_commit_are_one_work_notice(default_tiers):
    ann, _ = factories.member("ann", "pro")
    with psycopg.connect(**listener_connection_params(), autocommit=True) as session:
        session.execute(f"LISTEN {WORK_CHANNEL}")
        session.execute(f"LISTEN {END_OF_CHANGES}")
        jobs = [factories.job(ann).pk for _ in range(3)]
        Job.objects.filter(pk__in=jobs).update(status=JobStatus.CANCELLED)
        heard_until_end(session)

        Job.objects.filter(pk__in=jobs).update(status=JobStatus.QUEUED)
        heard = heard_until_end(session)

    assert [WorkNotice.parse(payload) for payload in heard] == [WorkNotice(WorkChange.QUEUED)]


@pytest.mark.parametrize(
    "notice",
    [
        WorkNotice(WorkChange.QUEUED),
        WorkNotice(WorkChange.FREED, 3),
        WorkNotice(WorkChange.GRANTED, 2**40),
        WorkNotice(WorkChange.OTHER),
    ],
)
def test_a_work_notice_sent_from_python_parses_as_itself(notice):
    assert WorkNotice.parse(notice.payload()) == notice


@pytest.mark.parametrize(
    "payload",
    [
        "",
        "queued",
        "freed 7",  # the space-separated format of migration 0015
        "[]",
        '{"change": "freed"}',
        '{"gpu": 7}',
        '{"change": "stolen", "gpu": 7}',
        '{"change": "freed", "gpu": "7"}',
        '{"change": "freed", "gpu": true}',
        '{"change": "freed", "gpu": 7.5}',
    ],
)
def test_a_payload_that_is_not_a_work_notice_is_refused(payload):
    with pytest.raises(ValueError):
        WorkNotice.parse(payload)


GRANTED = {
    "job": 17,
    "status": "running",
    "claim_token": "t",
    "lease_seconds": 30,
    "lease_expires_at": 1.5,
    "effective_score": 101.25,
    "gpu": 3,
}


def test_a_gateway_notice_reads_every_key():
    assert GatewayNotice.parse(json.dumps(GRANTED)) == GatewayNotice(
        job=17,
        status=JobStatus.RUNNING,
        claim_token="t",
        lease_seconds=30.0,
        lease_expires_at=1.5,
        effective_score=101.25,
        gpu=3,
    )


@pytest.mark.parametrize(
    "change",
    [
        {"job": None},
        {"job": "17"},
        {"status": "lost"},
        {"claim_token": 5},
        {"lease_seconds": "30"},
        {"effective_score": False},
        {"gpu": 3.5},
    ],
)
def test_a_gateway_notice_with_a_wrong_value_is_refused(change):
    with pytest.raises(ValueError):
        GatewayNotice.parse(json.dumps(GRANTED | change))


@pytest.mark.parametrize("key", sorted(GRANTED))
def test_a_gateway_notice_without_one_of_its_keys_is_refused(key):
    with pytest.raises(ValueError):
        GatewayNotice.parse(json.dumps({k: v for k, v in GRANTED.items() if k != key}))
