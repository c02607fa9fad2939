"""One delivery at a time, called in-process against a real receiver on
127.0.0.1: the event types, the attempt rules, redelivery and the pinned
address. The clusters are not involved (tests/e2e/test_webhooks.py has them)."""

import socket
from datetime import UTC, datetime
from email.utils import formatdate

import pytest
from django.contrib.auth import get_user_model
from standardwebhooks import Webhook

from queueapp import services
from queueapp.dispatch.loop import run_pass
from queueapp.models import Job, JobStatus, WebhookDelivery, WebhookStatus
from queueapp.selectors import db_now
from queueapp.upstream.simulator import LlamaSwapSimulator
from queueapp.webhooks.delivery import deliver_due
from tests import factories

# Committed transactions, as in production: the delivery code reads the
# database clock, which a test-wide transaction would stop.
pytestmark = pytest.mark.django_db(transaction=True)
SCHEDULE = [60.0, 600.0, 3600.0]
NAME = "hooks.example.test"


@pytest.fixture
def hooks(settings, default_tiers):
    settings.WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    # Retries fall due far beyond a deliver_due() budget: each call is one pass.
    settings.WEBHOOK_RETRY_SCHEDULE = SCHEDULE
    settings.WEBHOOK_TIMEOUT_SECONDS = 3
    settings.GPUSCHED_PUBLIC_URL = "https://gpu.example.org"


@pytest.fixture
def llama_swap(settings):
    sim = LlamaSwapSimulator("127.0.0.1", 0, {"chat-a": 0.01}, swap_seconds=0).start()
    settings.LLAMA_SWAP_URL = sim.url
    yield sim
    sim.stop()


@pytest.fixture
def ann():
    return factories.member("ann-member", "free")


def cancelled(member, url) -> WebhookDelivery:
    """The cheapest ended job: a queued one, cancelled."""
    job = services.job_cancel(job=factories.job_with_webhook(member, url), by="test")
    return WebhookDelivery.objects.get(job=job)


def deliver() -> None:
    """One pass: what is due now is attempted once (the retries are minutes away)."""
    deliver_due(budget_seconds=10)


def verified(receiver, member, index=-1) -> dict:
    request = receiver.requests[index]
    member.refresh_from_db()
    return Webhook(member.webhook_secret).verify(request["body"], request["headers"])


def seconds_until_retry(delivery) -> float:
    delivery.refresh_from_db()
    assert delivery.status == WebhookStatus.PENDING
    return (delivery.next_attempt_at - db_now()).total_seconds()


def test_a_succeeded_job_is_signed_with_links_a_receiver_can_follow(
    hooks, llama_swap, receivers, ann
):
    receiver = receivers()
    member, _ = ann
    job = factories.job_with_webhook(member, receiver.url)
    run_pass(budget_seconds=10)
    deliver()
    payload = verified(receiver, member)
    assert payload["type"] == "job.succeeded" and payload["data"]["status"] == "succeeded"
    assert payload["data"]["links"] == {
        "why": f"https://gpu.example.org/api/jobs/{job.pk}/why/",
        "why_page": f"https://gpu.example.org/jobs/{job.pk}/why/",
    }


def test_a_job_llama_swap_answers_with_an_error_sends_job_failed(hooks, llama_swap, receivers, ann):
    receiver = receivers()
    member, _ = ann
    job = factories.job_with_webhook(member, receiver.url, status=500)
    run_pass(budget_seconds=10)
    assert Job.objects.get(pk=job.pk).status == JobStatus.FAILED
    deliver()
    payload = verified(receiver, member)
    assert payload["type"] == "job.failed" and payload["data"]["status"] == "failed"
    assert "500" in payload["data"]["error"]


def test_cancelling_a_queued_job_sends_job_cancelled(hooks, receivers, ann, api):
    receiver = receivers()
    member, token = ann
    job = factories.job_with_webhook(member, receiver.url)
    assert api.as_member(token).delete(f"/api/jobs/{job.pk}/").status_code == 200
    deliver()
    payload = verified(receiver, member)
    assert payload["type"] == "job.cancelled" and payload["data"]["status"] == "cancelled"
    assert WebhookDelivery.objects.get(job=job).event_type == "job.cancelled"


def test_redelivery_sends_the_same_event_again_by_api_and_by_admin(
    hooks, receivers, ann, api, client
):
    receiver = receivers()
    member, token = ann
    delivery = cancelled(member, receiver.url)
    deliver()
    delivery.refresh_from_db()
    assert delivery.status == WebhookStatus.DELIVERED and len(receiver.requests) == 1

    response = api.as_member(token).post(f"/api/jobs/{delivery.job_id}/webhook/redeliver/")
    assert response.status_code == 202
    deliver()
    assert len(receiver.requests) == 2

    staff = get_user_model().objects.create_superuser("op", "", "pw-for-tests")
    client.force_login(staff)
    response = client.post(
        "/admin/queueapp/webhookdelivery/",
        {"action": "redeliver", "_selected_action": [delivery.pk]},
    )
    assert response.status_code == 302
    deliver()
    assert len(receiver.requests) == 3

    # Standard Webhooks: a message sent again keeps its id (receivers
    # de-duplicate by it) and is signed afresh.
    assert {request["headers"]["webhook-id"] for request in receiver.requests} == {
        delivery.webhook_id
    }
    assert [verified(receiver, member, i)["type"] for i in range(3)] == ["job.cancelled"] * 3
    log = api.as_member(token).get(f"/api/jobs/{delivery.job_id}/").json()["webhook"]
    [entry] = log["deliveries"]
    assert [a["status_code"] for a in entry["attempts"]] == [200, 200, 200]
    assert entry["status"] == "delivered"


def test_retry_after_sets_the_next_attempt(hooks, receivers, ann):
    in_two_minutes = formatdate(datetime.now(UTC).timestamp() + 120, usegmt=True)
    cases = [
        (503, None, (54, 66)),  # the schedule: 60 s with jitter
        (503, "90", (88, 90)),
        (429, "120", (118, 120)),
        # An HTTP-date, on the receiver's clock (its Date header): whole seconds.
        (503, in_two_minutes, (115, 121)),
        (503, "99999999", (3598, 3600)),  # never past the schedule's longest pause
    ]
    receiver = receivers(
        [(status, {"Retry-After": value} if value else {}) for status, value, _ in cases]
    )
    deliveries = [cancelled(ann[0], receiver.url) for _ in cases]
    before_attempts = db_now()
    deliver()  # oldest first: the answers go in order
    for delivery, (_, value, (low, high)) in zip(deliveries, cases, strict=True):
        left = seconds_until_retry(delivery)
        # The pause counts from its attempt, made after `before_attempts`: on a
        # slow machine seconds pass between that attempt and this check.
        since_attempts = (db_now() - before_attempts).total_seconds()
        assert left <= high and low <= left + since_attempts, (value, left, since_attempts)


def test_a_redirect_is_not_followed_and_counts_as_a_failure(hooks, receivers, ann):
    receiver = receivers()
    # 307 keeps the method: a client that followed it would POST again.
    receiver.answers = [(307, {"Location": f"http://127.0.0.1:{receiver.port}/elsewhere"})]
    delivery = cancelled(ann[0], receiver.url)
    deliver()
    assert [request["path"] for request in receiver.requests] == ["/hook"]
    assert seconds_until_retry(delivery) > 0
    assert "redirects are not followed" in delivery.last_error
    assert list(delivery.attempt_log.values_list("status_code", flat=True)) == [307]


class Resolver:
    """socket.getaddrinfo for NAME scripted per call; other hosts resolve as usual."""

    def __init__(self, monkeypatch, *answers):
        self.answers = list(answers)
        self.lookups = 0
        real = socket.getaddrinfo

        def getaddrinfo(host, port, *args, **kwargs):
            if host != NAME:
                return real(host, port, *args, **kwargs)
            self.lookups += 1
            answer = self.answers[min(self.lookups, len(self.answers)) - 1]
            if isinstance(answer, Exception):
                raise answer
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (answer, port))]

        monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


def test_a_name_that_does_not_resolve_is_retried_until_it_does(hooks, receivers, ann, monkeypatch):
    receiver = receivers()
    dns_down = socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
    resolver = Resolver(monkeypatch, dns_down, "127.0.0.1")
    delivery = cancelled(ann[0], f"http://{NAME}:{receiver.port}/hook")
    deliver()
    assert 54 <= seconds_until_retry(delivery) <= 66  # the usual backoff, not failed
    assert "does not resolve" in delivery.last_error
    WebhookDelivery.objects.filter(pk=delivery.pk).update(next_attempt_at=db_now())
    deliver()
    delivery.refresh_from_db()
    assert delivery.status == WebhookStatus.DELIVERED and resolver.lookups == 2
    assert len(receiver.requests) == 1


def test_a_name_that_resolves_to_a_refused_address_fails_for_good(
    hooks, receivers, ann, monkeypatch
):
    Resolver(monkeypatch, "10.0.0.1")
    delivery = cancelled(ann[0], f"http://{NAME}/hook")
    deliver()
    delivery.refresh_from_db()
    assert delivery.status == WebhookStatus.FAILED and delivery.attempts == 1
    assert "10.0.0.1 is a private address" in delivery.last_error


def test_the_connection_goes_to_the_address_that_was_checked(hooks, receivers, ann, monkeypatch):
    """DNS rebinding: a second lookup would answer 10.0.0.1; it must never be made."""
    receiver = receivers()
    resolver = Resolver(monkeypatch, "127.0.0.1", "10.0.0.1")
    delivery = cancelled(ann[0], f"http://{NAME}:{receiver.port}/hook")
    deliver()
    delivery.refresh_from_db()
    assert delivery.status == WebhookStatus.DELIVERED, delivery.last_error
    [request] = receiver.requests
    assert request["headers"]["host"] == f"{NAME}:{receiver.port}"
    assert resolver.lookups == 1
