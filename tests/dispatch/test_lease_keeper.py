"""The one lease keeper: renews what it holds on a clock, on a thread or as
a task, reports a lease another took once, and stops cleanly. The renewing
step is stubbed where the clock is what is tested; one test renews a real
claim in PostgreSQL."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading

import pytest
from django.db import connection

from gpusched.stack import wait_for
from queueapp.dispatch.claim import ClaimedJob, job_claim_next
from queueapp.dispatch.lease_keeper import LeaseKeeper
from queueapp.dispatch.outcomes import ClaimRecord
from queueapp.models import Job
from tests import factories

pytestmark = pytest.mark.database_server

KEEPER = "queueapp.dispatch.lease_keeper"


def held(job_id: int, *, lease_seconds: float = 0.6) -> ClaimRecord:
    """A claim whose lease is renewed every 0.2 s (a third of 0.6 s)."""
    return ClaimRecord(
        job_id=job_id, claim_token=f"token-{job_id}", lease_seconds=lease_seconds, gpu_id=None
    )


class Renewals:
    """A renewing step that records each claim renewed; `lost` says no."""

    def __init__(self, *, lost: frozenset[int] = frozenset()) -> None:
        self.lost = lost
        self.calls: list[int] = []

    def __call__(self, claim: ClaimRecord) -> bool:
        self.calls.append(claim.job_id)
        return claim.job_id not in self.lost

    def of(self, job_id: int) -> int:
        return self.calls.count(job_id)


def test_a_thread_renews_every_claim_held_until_stopped():
    renewals = Renewals()
    keeper = LeaseKeeper(lambda: [held(1), held(2)], name="lease-test", renew=renewals)
    with keeper:
        wait_for(lambda: renewals.of(1) >= 2 and renewals.of(2) >= 2, message="two renewals")
    # Stopped: the thread has ended (and closed its connection) when `with` leaves.
    assert "lease-test" not in {thread.name for thread in threading.enumerate()}
    assert keeper.interval() == pytest.approx(0.2)


def test_a_lease_another_took_is_reported_once_and_no_longer_renewed(caplog):
    caplog.set_level(logging.WARNING, logger=KEEPER)
    renewals = Renewals(lost=frozenset({1}))
    with LeaseKeeper(lambda: [held(1), held(2)], renew=renewals):
        wait_for(lambda: renewals.of(2) >= 3, message="three renewals of the kept lease")
    assert renewals.of(1) == 1
    assert [r.getMessage() for r in caplog.records if r.name == KEEPER] == [
        "job 1: lease lost during the call"
    ]


def test_a_renewal_that_fails_is_logged_and_tried_again(caplog):
    caplog.set_level(logging.ERROR, logger=KEEPER)
    calls: list[int] = []

    def renew(claim: ClaimRecord) -> bool:
        calls.append(claim.job_id)
        if len(calls) == 1:
            raise RuntimeError("the database is restarting")
        return True

    with LeaseKeeper(lambda: [held(1)], renew=renew):
        wait_for(lambda: len(calls) >= 2, message="a second renewal")
    assert [r.getMessage() for r in caplog.records if r.name == KEEPER] == ["lease renewal failed"]


def test_the_thread_runs_its_chores_at_every_wake_between_two_renewals():
    renewals = Renewals()
    chores: list[float] = []
    keeper = LeaseKeeper(
        lambda: [held(1, lease_seconds=60.0)],  # renewed every 20 s
        renew=renewals,
        beside=lambda: chores.append(1.0),
        wake_every=0.05,
    )
    with keeper:
        wait_for(lambda: len(chores) >= 3, message="three wakes")
    assert renewals.calls == []


def test_a_task_renews_with_the_same_step_and_stops_when_cancelled():
    renewals = Renewals(lost=frozenset({1}))
    threads: set[str] = set()

    def on_a_thread(step):
        def run() -> None:
            threads.add(threading.current_thread().name)
            step()

        return asyncio.to_thread(run)

    async def keep() -> LeaseKeeper:
        loop = asyncio.get_running_loop()
        twice = asyncio.Event()

        def renew(claim):
            renewed = renewals(claim)
            if renewals.of(2) >= 2:
                loop.call_soon_threadsafe(twice.set)
            return renewed

        keeper = LeaseKeeper(lambda: [held(1), held(2)], renew=renew)
        keeper.start_task(on_a_thread)
        await asyncio.wait_for(twice.wait(), timeout=10)
        keeper.stop()
        assert keeper._task is not None
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(keeper._task, timeout=10)
        return keeper

    keeper = asyncio.run(keep())
    assert keeper._task is not None and keeper._task.cancelled()
    assert renewals.of(1) == 1  # lost at the first renewal, as on a thread
    assert threading.main_thread().name not in threads


@pytest.mark.django_db(transaction=True)
def test_a_real_lease_is_extended_and_one_taken_over_is_let_go(default_tiers, caplog):
    caplog.set_level(logging.WARNING, logger=KEEPER)
    factories.policy(lease_seconds=1.0)
    ann, _ = factories.member("ann", "pro")
    job = factories.job(ann, model="chat-a")
    claim = job_claim_next(resident_model=None, worker="test")
    assert isinstance(claim, ClaimedJob) and claim.job_id == job.pk

    def expires_at():
        return Job.objects.values_list("lease_expires_at", flat=True).get(pk=job.pk)

    first = expires_at()
    try:
        with LeaseKeeper.of(claim):
            wait_for(lambda: expires_at() > first, message="the lease extended")
            Job.objects.filter(pk=job.pk).update(lease_owner="another claim")
            wait_for(
                lambda: any("lease lost" in r.getMessage() for r in caplog.records),
                message="the lost lease reported",
            )
    finally:
        connection.close()
