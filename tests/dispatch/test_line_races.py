"""Submissions, cancels and dispatches of one queue line at the same moment,
from separate connections as the web server and the GPU cluster make them:
the line never loses its head, so no queued job is left behind."""

import threading

import psycopg
import pytest
from django.db import connection, transaction

from gpusched.stack import wait_for
from queueapp import services
from queueapp.dispatch.claim import ClaimedJob, NoClaim, job_claim_next
from queueapp.dispatch.lease import job_end_durable
from queueapp.locks import MEMBER_LINES_LOCK
from queueapp.models import Job, JobStatus
from tests import factories
from tests.database import database_url, sessions_waiting_on_locks
from tests.dispatch.helpers import assert_one_head_per_line

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.database_server]

SUBMISSIONS = 150


def test_a_line_keeps_its_head_under_concurrent_submit_cancel_and_dispatch(default_tiers):
    ann, _ = factories.member("ann", "free")
    submitting_done = threading.Event()
    failures: list[BaseException] = []

    def in_thread(work):
        def run():
            try:
                work()
            except BaseException as exc:  # reported by the test below
                failures.append(exc)
            finally:
                connection.close()

        return threading.Thread(target=run)

    def submit_and_cancel():
        try:
            for index in range(SUBMISSIONS):
                job = factories.job(ann, model="chat-a", label=f"job-{index}")
                if index % 5 == 4:  # now and then a cancel of a queued job
                    queued = Job.objects.filter(pk=job.pk, status=JobStatus.QUEUED).first()
                    if queued is not None:
                        try:
                            services.job_cancel(job=queued, by="test")
                        except services.Conflict:
                            pass  # dispatched meanwhile
        finally:
            submitting_done.set()

    def dispatch():
        while True:
            outcome = job_claim_next(resident_model="chat-a", worker="test")
            if isinstance(outcome, ClaimedJob):
                job_end_durable(claim=outcome, answer=None, error="not sent", inline_limit=0)
            elif submitting_done.is_set() and isinstance(outcome, NoClaim):
                return

    threads = [in_thread(submit_and_cancel), in_thread(dispatch)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not failures, failures
    assert not any(thread.is_alive() for thread in threads)
    assert_one_head_per_line()
    # Whatever the race left (a claim skips a head a cancel holds), claim it
    # now: a job still queued after that is one whose line lost its head.
    while isinstance(outcome := job_claim_next(resident_model="chat-a", worker="test"), ClaimedJob):
        job_end_durable(claim=outcome, answer=None, error="not sent", inline_limit=0)
    assert Job.objects.filter(status=JobStatus.QUEUED).count() == 0
    assert Job.objects.count() == SUBMISSIONS


def test_a_claim_keeps_off_a_member_whose_lines_are_changing(default_tiers, monkeypatch):
    """While a submission or cancel holds the member's lines lock, the claim's
    UPDATE finds the lock taken, rolls back and tries again; after its last
    try it waits for the lock instead."""
    from gpusched.stack import wait_for
    from queueapp.dispatch import claim as claim_module
    from queueapp.locks import lock_member_lines
    from tests.database import sessions_waiting_on_locks

    monkeypatch.setattr(claim_module, "LINES_BUSY_MAX_TRIES", 3)
    monkeypatch.setattr(claim_module, "LINES_BUSY_RETRY_SECONDS", 0.0)
    ann, _ = factories.member("ann", "free")
    job = factories.job(ann)
    holding, release = threading.Event(), threading.Event()
    claimed = []

    def hold_the_lines():
        try:
            with transaction.atomic():
                lock_member_lines(ann.pk)
                holding.set()
                release.wait(timeout=30)
        finally:
            connection.close()

    def claim():
        try:
            claimed.append(job_claim_next(resident_model=None, worker="test"))
        finally:
            connection.close()

    holder = threading.Thread(target=hold_the_lines)
    holder.start()
    assert holding.wait(timeout=30)
    claimer = threading.Thread(target=claim)
    claimer.start()
    wait_for(
        lambda: (
            Job.objects.filter(pk=job.pk, status=JobStatus.QUEUED).exists()
            and sessions_waiting_on_locks() >= 1
        ),
        message="the claim to wait for the member's lines",
    )
    release.set()
    holder.join(timeout=30)
    claimer.join(timeout=30)
    assert [c.job_id for c in claimed] == [job.pk]
    assert Job.objects.get(pk=job.pk).status == JobStatus.RUNNING


def test_a_submission_that_waited_for_the_lines_lock_comes_after_the_head(default_tiers):
    """A submission held up (on a busy machine) between its transaction's
    start and the lines lock, while another begun later took the lock,
    committed and now heads the line: the waiting one is dated with that
    head, not before it, and the head stays its line's first job."""
    ann, _ = factories.member("ann", "free")
    head = factories.job(ann, model="chat-a", label="head")
    submitted: list[Job] = []

    def submit():
        try:
            submitted.append(factories.job(ann, model="chat-a", label="waited"))
        finally:
            connection.close()

    with psycopg.connect(database_url()) as holder:
        holder.execute("SELECT pg_advisory_xact_lock(%s, %s)", [MEMBER_LINES_LOCK, ann.pk])
        waiting = threading.Thread(target=submit)
        waiting.start()
        wait_for(lambda: sessions_waiting_on_locks() == 1, message="the submission to wait")
        # The head's submission, begun after the waiting one's, commits first.
        holder.execute(
            "UPDATE queueapp_job SET submitted_at = clock_timestamp() WHERE id = %s", [head.pk]
        )
        holder.commit()
    waiting.join(timeout=30)
    (job,) = submitted
    assert job.submitted_at >= Job.objects.get(pk=head.pk).submitted_at
    assert_one_head_per_line()
