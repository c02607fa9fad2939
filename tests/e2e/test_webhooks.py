"""Signed webhooks end to end: a real receiver on 127.0.0.1, the real GPU and
webhook clusters, the simulator."""

import pytest
from standardwebhooks import Webhook

from gpusched.stack import wait_for
from queueapp.models import Job, JobStatus, Member, WebhookDelivery
from tests import factories

pytestmark = [pytest.mark.e2e]
WEBHOOK_ENV = {
    "WEBHOOK_ALLOWED_NETWORKS": "127.0.0.0/8",
    "GPUSCHED_WEBHOOK_RETRY_SCHEDULE": "0.3,0.3,0.3,0.3",
}


@pytest.fixture
def hooks(world, settings):
    settings.WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    world.start_cluster(**WEBHOOK_ENV)
    return world.start_cluster(Q_CLUSTER_NAME="webhooks", **WEBHOOK_ENV)


def test_signed_retried_until_success_with_one_webhook_id(world, hooks, receivers, api):
    receiver = receivers([500, 500, 200])
    member, token = factories.member("ann-member", "free")
    job = factories.job_with_webhook(member, receiver.url)
    wait_for(lambda: len(receiver.requests) == 3, message="three delivery attempts")
    secret = Member.objects.get(pk=member.pk).webhook_secret
    verifier = Webhook(secret)
    ids = set()
    for request in receiver.requests:
        headers = request["headers"]
        payload = verifier.verify(request["body"], headers)  # raises if the signature is wrong
        ids.add(headers["webhook-id"])
    assert len(ids) == 1  # the same id on every retry: receivers can de-duplicate
    assert payload["type"] == "job.succeeded"
    assert payload["data"]["id"] == job.pk and payload["data"]["status"] == "succeeded"
    wait_for(
        lambda: WebhookDelivery.objects.filter(job=job, status="delivered").exists(),
        message="the delivery to be marked delivered",
    )
    log = api.as_member(token).get(f"/api/jobs/{job.pk}/").json()["webhook"]["deliveries"][0]
    assert [a["status_code"] for a in log["attempts"]] == [500, 500, 200]
    assert log["status"] == "delivered"


def test_410_disables_the_url_and_is_not_retried(world, hooks, receivers):
    receiver = receivers([410])
    member, _ = factories.member("ann-member", "free")
    first = factories.job_with_webhook(member, receiver.url)
    wait_for(
        lambda: WebhookDelivery.objects.filter(job=first, status="disabled").exists(),
        message="the 410 to disable the URL",
    )
    second = factories.job_with_webhook(member, receiver.url)
    wait_for(
        lambda: (
            Job.objects.get(pk=second.pk).status == JobStatus.SUCCEEDED
            and WebhookDelivery.objects.filter(job=second, status="disabled").exists()
        ),
        message="the second job's event to be held back",
    )
    assert len(receiver.requests) == 1


def test_a_delivery_survives_a_killed_webhook_worker(world, settings, receivers):
    settings.WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    slow_retry = {**WEBHOOK_ENV, "GPUSCHED_WEBHOOK_RETRY_SCHEDULE": "2"}
    world.start_cluster(**slow_retry)
    webhooks = world.start_cluster(Q_CLUSTER_NAME="webhooks", **slow_retry)
    receiver = receivers([503, 200])
    member, _ = factories.member("ann-member", "free")
    job = factories.job_with_webhook(member, receiver.url)
    wait_for(
        lambda: WebhookDelivery.objects.filter(job=job, attempts=1).exists(),
        message="the first, failing attempt to be recorded",
    )
    webhooks.kill()  # between the attempts
    world.start_cluster(Q_CLUSTER_NAME="webhooks", **slow_retry)
    wait_for(
        lambda: WebhookDelivery.objects.filter(job=job, status="delivered").exists(),
        timeout=60,
        message="the delivery to complete after the restart",
    )
    assert len(receiver.requests) == 2


def test_a_receiver_that_never_answers_delays_no_dispatch(world, hooks, receivers):
    receiver = receivers(hang=True)
    member, _ = factories.member("ann-member", "free")
    factories.job_with_webhook(member, receiver.url)
    wait_for(lambda: receiver.requests, message="the hanging delivery to start")
    later = [factories.job_with_webhook(member, "", seconds=0.05) for _ in range(3)]
    wait_for(
        lambda: Job.objects.filter(pk__in=[j.pk for j in later], status="succeeded").count() == 3,
        timeout=10,
        message="the next jobs to run while the receiver hangs",
    )
    entries = world.served()
    assert len(entries) == 4
    assert entries[-1]["finished_at"] < receiver.requests[0]["at"] + 5  # not after a 15 s timeout


def test_refused_addresses(world, api, settings):
    settings.WEBHOOK_ALLOWED_NETWORKS = []
    _, token = factories.member("ann-member", "free")
    for url in [
        "http://127.0.0.1/",
        "http://[::1]/",
        "http://169.254.169.254/",
        "http://10.0.0.1/",
    ]:
        response = api.as_member(token).post(
            "/api/jobs/",
            {"path": "/v1/chat/completions", "body": factories.chat_body(), "callback_url": url},
            format="json",
        )
        assert response.status_code == 400, url
        assert response.json()["detail"].startswith("callback_url:")
    # A name is resolved at delivery: refused there, recorded as a failed delivery.
    world.start_cluster()
    world.start_cluster(Q_CLUSTER_NAME="webhooks")
    member = Member.objects.get(name="ann-member")
    job = factories.job_with_webhook(member, "http://localhost:9/hook")
    delivery = wait_for(
        lambda: WebhookDelivery.objects.filter(job=job, status="failed").first(),
        message="the delivery to be refused",
    )
    assert "loopback" in delivery.last_error
