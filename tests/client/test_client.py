"""`Client` against httpx.MockTransport: one behaviour of the client per test."""

from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import httpx
import pytest

import gpusched_client
from gpusched_client import (
    BadRequest,
    Client,
    Conflict,
    Forbidden,
    GpuschedError,
    NotFound,
    RateLimited,
    Unauthorized,
    Unavailable,
)


def client_for(handler, **arguments):
    return Client(transport=httpx.MockTransport(handler), **arguments)


def answer_job(request):
    return httpx.Response(200, json={"id": 7, "status": "queued"})


def test_url_and_token_arguments_win_over_the_environment(monkeypatch):
    monkeypatch.setenv("GPUSCHED_URL", "http://from-env:1")
    monkeypatch.setenv("GPUSCHED_TOKEN", "env-token")
    seen = []

    def handler(request):
        seen.append(request)
        return answer_job(request)

    with client_for(handler, url="http://given:8000/", token="given-token") as client:
        client.get(7)
    assert str(seen[0].url) == "http://given:8000/api/jobs/7/"
    assert seen[0].headers["Authorization"] == "Bearer given-token"


def test_url_and_token_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("GPUSCHED_URL", "http://from-env:9000")
    monkeypatch.setenv("GPUSCHED_TOKEN", "env-token")
    seen = []

    def handler(request):
        seen.append(request)
        return answer_job(request)

    with client_for(handler) as client:
        client.get(7)
    assert str(seen[0].url) == "http://from-env:9000/api/jobs/7/"
    assert seen[0].headers["Authorization"] == "Bearer env-token"


def test_no_token_anywhere_is_unauthorized_before_any_request(monkeypatch):
    monkeypatch.delenv("GPUSCHED_TOKEN", raising=False)
    with pytest.raises(Unauthorized, match="GPUSCHED_TOKEN"):
        client_for(lambda request: pytest.fail("no request without a token"))


def test_wait_calls_on_change_once_per_state_change(monkeypatch):
    monkeypatch.setenv("GPUSCHED_TOKEN", "t")
    states = [
        ("queued", 2),
        ("queued", 2),
        ("queued", 1),
        ("queued", 1),
        ("running", None),
        ("running", None),
        ("running", None),
        ("succeeded", None),
    ]
    answers = iter(states)

    def handler(request):
        status, position = next(answers)
        estimate = {"position": position} if position else None
        return httpx.Response(200, json={"id": 7, "status": status, "estimate": estimate})

    seen = []
    with client_for(handler) as client:
        final = client.wait(
            7,
            on_change=lambda job: seen.append(
                (job["status"], (job["estimate"] or {}).get("position"))
            ),
            poll_seconds=0,
        )
    assert final["status"] == "succeeded"
    assert seen == [("queued", 2), ("queued", 1), ("running", None), ("succeeded", None)]


def test_a_connection_error_is_unavailable(monkeypatch):
    monkeypatch.setenv("GPUSCHED_TOKEN", "t")

    def handler(request):
        raise httpx.ConnectError("connection refused", request=request)

    with client_for(handler, url="http://nowhere:1") as client:
        with pytest.raises(Unavailable) as raised:
            client.queue()
    assert raised.value.status_code == 0
    assert "cannot reach gpusched at http://nowhere:1" in raised.value.message
    assert isinstance(raised.value, GpuschedError)


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, BadRequest),
        (401, Unauthorized),
        (403, Forbidden),
        (404, NotFound),
        (409, Conflict),
        (429, RateLimited),
        (503, Unavailable),
        (500, GpuschedError),
    ],
)
def test_each_error_answer_raises_its_class_with_the_servers_message(monkeypatch, status, kind):
    monkeypatch.setenv("GPUSCHED_TOKEN", "t")

    def handler(request):
        return httpx.Response(status, json={"detail": f"the server says {status}"})

    with client_for(handler) as client:
        with pytest.raises(GpuschedError) as raised:
            client.cancel(7)
    assert type(raised.value) is kind
    assert raised.value.status_code == status
    assert raised.value.message == f"the server says {status}"
    assert raised.value.retry_after is None


def test_rate_limited_carries_retry_after_in_seconds_or_as_a_date(monkeypatch):
    monkeypatch.setenv("GPUSCHED_TOKEN", "t")
    later = format_datetime(datetime.now(UTC) + timedelta(seconds=90), usegmt=True)
    answers = iter(["30", later, "soon"])

    def handler(request):
        headers = {"Retry-After": next(answers)}
        return httpx.Response(429, json={"detail": "queue limit reached"}, headers=headers)

    with client_for(handler) as client:
        caught = []
        for _ in range(3):
            with pytest.raises(RateLimited) as raised:
                client.submit(path="/v1/completions", body={"model": "m"})
            caught.append(raised.value.retry_after)
    assert caught[0] == 30
    assert 80 < caught[1] <= 90
    assert caught[2] is None  # an unreadable header is no figure, not a crash


def test_an_error_answer_that_is_not_a_json_object_keeps_its_text(monkeypatch):
    monkeypatch.setenv("GPUSCHED_TOKEN", "t")
    answers = iter(
        [
            httpx.Response(400, json=["body", "model"]),
            httpx.Response(502, text="<html>Bad Gateway</html>"),
            httpx.Response(404, json={"detail": {"job": "gone"}}),
        ]
    )

    with client_for(lambda request: next(answers)) as client:
        with pytest.raises(BadRequest, match=r'\["body","model"\]'):
            client.get(1)
        with pytest.raises(Unavailable, match="Bad Gateway"):
            client.get(1)
        with pytest.raises(NotFound, match="gone"):
            client.get(1)


@pytest.mark.parametrize(
    "answer",
    [
        httpx.Response(200, json=[1, 2]),
        httpx.Response(200, json="queued"),
        httpx.Response(200, text="<html>a login page</html>"),
    ],
)
def test_a_success_answer_that_is_not_a_json_object_is_an_error_not_a_crash(monkeypatch, answer):
    monkeypatch.setenv("GPUSCHED_TOKEN", "t")
    with client_for(lambda request: answer) as client:
        with pytest.raises(GpuschedError):
            client.get(1)
        with pytest.raises(GpuschedError):
            client.jobs(status="queued")
        with pytest.raises(GpuschedError):
            client.wait(1, poll_seconds=0)


def test_the_error_classes_are_exported_and_share_the_base():
    for name in ("BadRequest", "Unauthorized", "NotFound", "Conflict", "RateLimited"):
        kind = getattr(gpusched_client, name)
        assert issubclass(kind, gpusched_client.GpuschedError)
        assert name in gpusched_client.__all__


def test_submit_sends_the_wait_bound_and_wait_ends_at_expired(monkeypatch):
    monkeypatch.setenv("GPUSCHED_TOKEN", "t")
    sent = []
    answers = iter(["queued", "expired"])

    def handler(request):
        if request.method == "POST":
            sent.append(request.headers.get("X-Gpusched-Max-Wait"))
            return httpx.Response(201, json={"id": 7, "status": "queued"})
        return httpx.Response(200, json={"id": 7, "status": next(answers)})

    with client_for(handler) as client:
        client.submit(path="/v1/completions", body={"model": "m"}, max_wait=60)
        client.submit(path="/v1/completions", body={"model": "m"})
        assert client.wait(7, poll_seconds=0)["status"] == "expired"
    assert sent == ["60", None]


def test_a_gpu_busy_refusal_is_unavailable_with_the_forecasts_retry_after(monkeypatch):
    monkeypatch.setenv("GPUSCHED_TOKEN", "t")

    def handler(request):
        detail = "gpu0 held by job 3 (m, band 0) for 2.0 s; 0 jobs wait ahead; ..."
        return httpx.Response(
            503, json={"detail": detail, "code": "gpu_busy"}, headers={"Retry-After": "340"}
        )

    with client_for(handler) as client, pytest.raises(Unavailable) as refused:
        client.submit(path="/v1/completions", body={"model": "m"}, max_wait=5)
    assert refused.value.retry_after == 340 and "gpu0 held by job 3" in refused.value.message
