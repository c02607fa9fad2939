"""The dispatcher ends a job and claims its GPU's next in one commit
(`lease.job_end_and_claim_next`), against real PostgreSQL."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from queueapp import services
from queueapp.dispatch.claim import ClaimedJob, job_claim_next
from queueapp.dispatch.lease import job_end_and_claim_next
from queueapp.models import DispatchDecision, Job, JobStatus
from queueapp.upstream.client import UpstreamAnswer
from tests import factories

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.database_server]

ANSWER = UpstreamAnswer(200, "application/json", b'{"choices": []}', None)


def end_and_claim(claim: ClaimedJob) -> ClaimedJob | None:
    return job_end_and_claim_next(
        claim=claim,
        answer=ANSWER,
        error=None,
        inline_limit=10_000,
        resident_model=claim.model,
        worker="test",
    )


def test_the_end_and_the_next_claim_are_one_commit(default_tiers):
    gpu = services.gpu_register(name="gpu0", url="http://127.0.0.1:9")
    ann, _ = factories.member("ann", "pro")
    bob, _ = factories.member("bob", "pro")
    first = factories.job(ann, model="a")
    second = factories.job(bob, model="b")
    third = factories.job(bob, model="a")  # later, but of the model just loaded
    claim = job_claim_next(resident_model=None, worker="test", gpu=gpu.pk)
    assert claim is not None and claim.job_id == first.pk

    with CaptureQueriesContext(connection) as captured:
        following = end_and_claim(claim)
    assert [q["sql"] for q in captured.captured_queries].count("COMMIT") == 1
    assert following is not None and following.job_id == third.pk  # affinity for model a
    assert Job.objects.get(pk=first.pk).status == JobStatus.SUCCEEDED
    assert Job.objects.get(pk=third.pk).status == JobStatus.RUNNING
    assert DispatchDecision.objects.get(job=third).resident_model == "a"
    assert Job.objects.get(pk=second.pk).status == JobStatus.QUEUED


def test_nothing_is_claimed_when_the_lease_was_lost_or_nothing_waits(default_tiers):
    gpu = services.gpu_register(name="gpu0", url="http://127.0.0.1:9")
    ann, _ = factories.member("ann", "pro")
    first = factories.job(ann, model="a")
    factories.job(ann, model="a")
    claim = job_claim_next(resident_model=None, worker="test", gpu=gpu.pk)
    assert claim is not None and claim.job_id == first.pk
    Job.objects.filter(pk=first.pk).update(lease_owner="someone-else")  # the lease was lost
    assert end_and_claim(claim) is None
    assert Job.objects.filter(status=JobStatus.RUNNING).count() == 1  # only the lost one

    Job.objects.filter(pk=first.pk).update(lease_owner=claim.claim_token)
    following = end_and_claim(claim)
    assert following is not None
    assert end_and_claim(following) is None  # the queue is empty
    assert not Job.objects.filter(status=JobStatus.RUNNING).exists()


def test_an_answers_content_type_longer_than_its_column_does_not_lose_the_end(default_tiers):
    gpu = services.gpu_register(name="gpu0", url="http://127.0.0.1:9")
    ann, _ = factories.member("ann", "pro")
    job = factories.job(ann, model="a")
    claim = job_claim_next(resident_model=None, worker="test", gpu=gpu.pk)
    assert isinstance(claim, ClaimedJob) and claim.job_id == job.pk
    long_type = "application/json; " + "x" * 500
    answer = UpstreamAnswer(200, long_type, b'{"choices": []}', None)
    job_end_and_claim_next(
        claim=claim,
        answer=answer,
        error=None,
        inline_limit=10_000,
        resident_model="a",
        worker="test",
    )
    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED
    assert long_type.startswith(job.result_content_type) and len(job.result_content_type) == 200
