"""A dispatcher asked to stop (Ctrl-C, `make run` stopping) finishes the job
it sent and sends no other: a job claimed as the stop comes goes back to
the queue unsent. The dispatcher in this process, the simulator over real
HTTP, real PostgreSQL."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection

from gpusched.stack import wait_for
from queueapp import services
from queueapp.dispatch.claim import ClaimedJob, job_claim_next
from queueapp.dispatch.loop import STOPPING_REASON, Dispatcher, Ended, Wait, run_pass
from queueapp.dispatch.wakeup import STOP_REQUESTED
from queueapp.models import Job, JobEvent, JobStatus
from queueapp.upstream.simulator import LlamaSwapSimulator
from tests import factories

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.database_server]


@pytest.fixture
def llama_swap(settings, default_tiers):
    sim = LlamaSwapSimulator("127.0.0.1", 0, {"chat-a": 0.01}, swap_seconds=0).start()
    settings.LLAMA_SWAP_URL = sim.url
    yield sim
    sim.stop()


@pytest.fixture
def stop_requested():
    """STOP_REQUESTED is the worker process's: cleared for the next test."""
    STOP_REQUESTED.clear()
    yield STOP_REQUESTED
    STOP_REQUESTED.clear()


def sent_labels(sim: LlamaSwapSimulator) -> list[str]:
    """The `user` of each request llama-swap received, in order."""
    return [entry["body"]["user"] for entry in sim.log()]


def assert_returned_unsent(job: Job) -> None:
    job.refresh_from_db()
    assert job.status == JobStatus.QUEUED
    assert job.attempts == 0  # the claim undone: it never ran
    returned = JobEvent.objects.filter(job=job, kind=JobEvent.Kind.RETURNED_TO_QUEUE)
    assert [event.detail["reason"] for event in returned] == [STOPPING_REASON]


def test_a_stop_during_a_call_lets_its_job_finish_and_claims_no_other(llama_swap, stop_requested):
    ann, _ = factories.member("ann", "pro")
    running = factories.job(ann, model="chat-a", seconds=0.5, label="running")
    backlog = [factories.job(ann, model="chat-a", label=f"next-{n}") for n in range(2)]

    def stop_once_sent() -> None:
        wait_for(lambda: sent_labels(llama_swap) == ["running"], message="the first job sent")
        stop_requested.set()  # as SIGINT to the worker does

    stopper = threading.Thread(target=stop_once_sent)
    stopper.start()
    try:
        report = run_pass(budget_seconds=20, wait_when_idle=True)
    finally:
        stopper.join()
        connection.close()

    assert report.ended_because == "cluster stopping"
    running.refresh_from_db()
    assert running.status == JobStatus.SUCCEEDED, running.error
    assert sent_labels(llama_swap) == ["running"]
    for job in backlog:
        job.refresh_from_db()
        assert job.status == JobStatus.QUEUED
    assert not Job.objects.filter(status=JobStatus.FAILED).exists()


def test_the_job_claimed_in_the_last_ones_end_goes_back_unsent_when_the_stop_comes(
    llama_swap, stop_requested
):
    """The race of a Ctrl-C at the instant a job ends and the next is claimed."""
    ann, _ = factories.member("ann", "pro")
    first = factories.job(ann, model="chat-a", label="first")
    second = factories.job(ann, model="chat-a", label="second")
    dispatcher = Dispatcher(
        services.gpu_configured(None), deadline=time.monotonic() + 20, wait_when_idle=False
    )
    try:
        assert isinstance(dispatcher.tick(), Wait)  # runs the first, claims the second in its end
        assert dispatcher.following is not None
        assert dispatcher.following.job_id == second.pk
        assert Job.objects.get(pk=second.pk).status == JobStatus.RUNNING
        stop_requested.set()  # the Ctrl-C lands now
        assert dispatcher.tick() == Ended("cluster stopping")
    finally:
        dispatcher.close()

    assert dispatcher.report.ended_because == "cluster stopping"
    assert Job.objects.get(pk=first.pk).status == JobStatus.SUCCEEDED
    assert_returned_unsent(second)
    assert sent_labels(llama_swap) == ["first"]


def test_a_job_claimed_as_the_stop_comes_is_not_sent(llama_swap, stop_requested):
    ann, _ = factories.member("ann", "pro")
    job = factories.job(ann, model="chat-a", label="claimed")
    dispatcher = Dispatcher(
        services.gpu_configured(None), deadline=time.monotonic() + 20, wait_when_idle=False
    )
    try:
        claim = job_claim_next(resident_model=None, worker=dispatcher.worker)
        assert isinstance(claim, ClaimedJob) and claim.job_id == job.pk
        stop_requested.set()  # between the claim and the call
        assert dispatcher._run(claim) == Ended("cluster stopping")
    finally:
        dispatcher.close()

    assert_returned_unsent(job)
    assert sent_labels(llama_swap) == []
