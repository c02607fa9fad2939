"""A queued job whose wait bound passes expires, never reaching llama-swap:
the dispatcher in this process, the simulator over real HTTP, a real webhook
receiver."""

import threading

import pytest
from django.db import connection, transaction
from django.db.models.functions import Now
from standardwebhooks import Webhook

from gpusched.stack import wait_for
from queueapp import services, transitions
from queueapp.dispatch.claim import HeadsOverdue, job_claim_next
from queueapp.dispatch.loop import run_pass
from queueapp.models import Job, JobEvent, JobStatus, Member, RunStats
from queueapp.transitions import NotStarted
from queueapp.upstream.simulator import LlamaSwapSimulator
from queueapp.webhooks.delivery import deliver_due
from tests import factories
from tests.dispatch.helpers import assert_one_head_per_line
from tests.factories import chat_body

pytestmark = pytest.mark.django_db(transaction=True)
PATH = "/v1/chat/completions"


@pytest.fixture
def llama_swap(settings, default_tiers):
    settings.WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    sim = LlamaSwapSimulator("127.0.0.1", 0, {"chat-a": 0.01}, swap_seconds=0).start()
    settings.LLAMA_SWAP_URL = sim.url
    yield sim
    sim.stop()


def dispatch_in_thread() -> None:
    """A dispatcher's pass, its thread's connection closed after it."""
    try:
        run_pass(budget_seconds=20)
    finally:
        connection.close()


def bounded_job(owner: Member, *, max_wait: float, label: str, callback_url: str = "") -> Job:
    body = {**chat_body("chat-a"), "user": label}
    return services.job_submit(
        member=owner,
        path=PATH,
        body=body,
        model="chat-a",
        priority_header=None,
        callback_url=callback_url,
        max_wait=max_wait,
    )


def test_a_job_accepted_within_its_bound_expires_when_the_running_job_outlasts_it(
    llama_swap, receivers
):
    receiver = receivers()
    ann, _ = factories.member("ann-member", "pro")
    # The forecast expects chat-a jobs to take 0.2 s; this one takes 3 s.
    RunStats.objects.create(model="chat-a", path=PATH, warm_seconds=0.2, warm_samples=5)
    held = factories.job(ann, model="chat-a", seconds=3, label="held")
    dispatching = threading.Thread(target=dispatch_in_thread)
    dispatching.start()
    try:
        wait_for(lambda: Job.objects.get(pk=held.pk).status == JobStatus.RUNNING, message="held")
        job = bounded_job(ann, max_wait=1.0, label="bounded", callback_url=receiver.url)
        wait_for(
            lambda: Job.objects.get(pk=job.pk).status == JobStatus.EXPIRED,
            timeout=10,
            message="the bounded job to expire",
        )
        job.refresh_from_db()
        # The held job still runs: the bound passed while it held the GPU.
        assert Job.objects.get(pk=held.pk).status == JobStatus.RUNNING
    finally:
        dispatching.join(timeout=30)
    assert (job.finished_at - job.submitted_at).total_seconds() >= 1.0
    assert job.started_at is None and job.gpu_id is None
    assert job.error.startswith(f"gpu0 held by job {held.pk} (chat-a, band 0) for ")
    assert job.error.endswith("0 jobs wait ahead; it did not start within its 1 s bound")
    assert [entry["body"].get("user") for entry in llama_swap.log()] == ["held"]
    event = JobEvent.objects.get(job=job, kind=JobEvent.Kind.EXPIRED)
    assert event.detail == {"bound_seconds": 1.0, "error": job.error}

    deliver_due(budget_seconds=10)
    (request,) = receiver.requests
    secret = Member.objects.get(pk=ann.pk).webhook_secret
    payload = Webhook(secret).verify(request["body"], request["headers"])
    assert payload["type"] == "job.expired"
    assert payload["data"]["status"] == "expired" and payload["data"]["error"] == job.error


def test_the_claim_never_starts_an_overdue_head_and_the_dispatcher_expires_it(llama_swap):
    ann, _ = factories.member("ann-member", "pro")
    overdue = bounded_job(ann, max_wait=60, label="overdue")
    following = factories.job(ann, model="chat-a", label="following")
    Job.objects.filter(pk=overdue.pk).update(wait_deadline=Now())
    gpu = services.gpu_configured(None)

    outcome = job_claim_next(resident_model=None, worker="test", gpu=gpu.pk)
    assert outcome == HeadsOverdue([overdue.pk])
    with transaction.atomic():
        started = transitions.start(
            job_id=overdue.pk,
            gpu_id=gpu.pk,
            slot=0,
            now=Job.objects.get(pk=overdue.pk).wait_deadline,
            lease_seconds=15,
            token="test",
            attempt=1,
            terms={},
            wait=False,
            check_limit=False,
        )
    assert started is NotStarted.OVERDUE  # the start itself refuses a job past its bound

    run_pass(budget_seconds=10)
    assert Job.objects.get(pk=overdue.pk).status == JobStatus.EXPIRED
    assert Job.objects.get(pk=following.pk).status == JobStatus.SUCCEEDED
    assert [entry["body"].get("user") for entry in llama_swap.log()] == ["following"]
    assert_one_head_per_line()


def test_an_operator_requeue_of_an_expired_job_clears_its_bound(llama_swap):
    ann, _ = factories.member("ann-member", "pro")
    job = bounded_job(ann, max_wait=60, label="again")
    Job.objects.filter(pk=job.pk).update(wait_deadline=Now())
    assert services.jobs_expire_overdue() == 1
    requeued = services.job_requeue(job=Job.objects.get(pk=job.pk), by="op")
    assert requeued.status == JobStatus.QUEUED and requeued.wait_deadline is None
    assert requeued.error == ""
    assert services.jobs_expire_overdue() == 0
