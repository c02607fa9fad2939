"""The work channel (queueapp/dispatch/wakeup.py): the jobs table's trigger
says what happened and on which GPU (queueapp/sql/job_notify.sql), and a
dispatcher whose GPU is busy wakes only when that GPU is left free. Real
notifications, real PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from queueapp import services
from queueapp.dispatch.claim import ClaimedJob, job_claim_next
from queueapp.dispatch.lease import job_end_durable
from queueapp.dispatch.wakeup import WORK_CHANNEL, WorkListener
from queueapp.job_notices import WorkChange, WorkNotice
from queueapp.live.events import listener_connection_params
from queueapp.upstream.client import UpstreamAnswer
from tests import factories

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.database_server]

HEARD_WITHIN_S = 10.0  # a notification committed now arrives well within this
SILENCE_S = 0.3  # how long a wait that must not wake is given


MINE, OTHER = 7, 8  # GPU ids


@pytest.fixture
def work() -> Iterator[WorkListener]:
    listener = WorkListener(MINE)
    listener.start()
    yield listener
    listener.close()


FREED, GRANTED = WorkChange.FREED, WorkChange.GRANTED
QUEUED = WorkNotice(WorkChange.QUEUED).payload()
OTHER_WORK = WorkNotice(WorkChange.OTHER).payload()


def on(change: WorkChange, gpu: int = MINE) -> str:
    return WorkNotice(change, gpu).payload()


def announce(*payloads: str) -> None:
    """`payloads` on the work channel, in one commit and in this order."""
    with psycopg.connect(**listener_connection_params()) as session:
        for payload in payloads:
            session.execute("SELECT pg_notify(%s, %s)", [WORK_CHANNEL, payload])
        session.commit()


def test_an_idle_dispatcher_wakes_for_any_work(work):
    announce(QUEUED)
    assert work.wait(HEARD_WITHIN_S)


def test_a_busy_dispatcher_sleeps_through_submissions(work):
    announce(QUEUED, OTHER_WORK)
    assert not work.wait(SILENCE_S, until_freed=True)
    announce(on(FREED))
    assert work.wait(HEARD_WITHIN_S, until_freed=True)


def test_an_end_that_grants_the_next_job_in_its_commit_keeps_it_asleep(work):
    announce(on(FREED), on(GRANTED))
    assert not work.wait(SILENCE_S, until_freed=True)
    announce(on(GRANTED), on(FREED))
    assert work.wait(HEARD_WITHIN_S, until_freed=True)


def test_a_busy_dispatcher_sleeps_through_other_gpus_ends(work):
    announce(on(FREED, OTHER), on(GRANTED, OTHER), on(FREED, OTHER))
    assert not work.wait(SILENCE_S, until_freed=True)
    announce(on(FREED, OTHER), on(FREED))
    assert work.wait(HEARD_WITHIN_S, until_freed=True)


def test_a_notice_that_is_not_the_triggers_neither_wakes_nor_ends_a_busy_wait(work):
    announce("freed 7", "", '{"change": "freed"}')
    assert not work.wait(SILENCE_S, until_freed=True)
    announce("freed 7", on(FREED))
    assert work.wait(HEARD_WITHIN_S, until_freed=True)


def test_the_trigger_says_queued_granted_and_freed(default_tiers):
    ann, _ = factories.member("ann", "pro")
    gpu = services.gpu_register(name="gpu0", url="http://127.0.0.1:9")
    with psycopg.connect(**listener_connection_params(), autocommit=True) as session:
        session.execute(f"LISTEN {WORK_CHANNEL}")
        factories.job(ann)
        claim = job_claim_next(resident_model=None, worker="test", gpu=gpu.pk)
        assert isinstance(claim, ClaimedJob)
        job_end_durable(
            claim=claim,
            answer=UpstreamAnswer(200, "application/json", b"{}", None),
            error=None,
            inline_limit=1000,
        )
        heard = [n.payload for n in session.notifies(timeout=HEARD_WITHIN_S, stop_after=3)]
    assert [WorkNotice.parse(payload) for payload in heard] == [
        WorkNotice(WorkChange.QUEUED),
        WorkNotice(GRANTED, gpu.pk),
        WorkNotice(FREED, gpu.pk),
    ]
