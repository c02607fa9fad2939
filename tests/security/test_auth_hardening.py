"""Logins and the protections around them: failed tokens are rate-limited at
every door, the admin wants staff, CSRF and the Host check stay on, DEBUG is
off unless asked for, and secrets stay out of logs and error pages."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time

import httpx
import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings as django_settings
from django.contrib.auth import get_user_model
from django.db import connection, connections
from django.test import Client
from django.test.utils import CaptureQueriesContext

from gpusched.asgi import application
from gpusched.stack import ROOT, free_port, wait_for
from queueapp.live.consumers import CLOSE_TOO_MANY_FAILURES
from queueapp.live.hub import hub
from queueapp.webhooks.delivery import deliver_due
from tests import factories
from tests.database import database_url
from tests.frontdoor.client import FrontDoorClient

pytestmark = pytest.mark.django_db

LIMIT = 20  # GPUSCHED_AUTH_FAILURES_PER_MINUTE's default


@pytest.fixture
def member(default_tiers):
    return factories.member("ann", "pro")


def api_get(token: str, address: str = "127.0.0.1"):
    return Client(REMOTE_ADDR=address).get("/api/me/", HTTP_AUTHORIZATION=f"Bearer {token}")


def front_door(token: str, address: str = "127.0.0.1"):
    return FrontDoorClient(REMOTE_ADDR=address).post(
        "/v1/chat/completions",
        data=b"not json",
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )


def page_login(token: str, address: str = "127.0.0.1"):
    return Client(REMOTE_ADDR=address).post("/login/", {"token": token, "next": "/"})


def test_the_default_limit_is_20_failures_a_minute():
    assert django_settings.GPUSCHED_AUTH_FAILURES_PER_MINUTE == LIMIT


def test_token_guessing_on_the_api_is_refused_for_a_minute_even_with_the_right_token(
    member, monkeypatch
):
    _, token = member
    assert api_get(token).status_code == 200
    statuses = [api_get(f"gps_guess{i}").status_code for i in range(LIMIT)]
    assert statuses == [401] * LIMIT
    refused = api_get(token)
    assert refused.status_code == 429
    assert 1 <= int(refused["Retry-After"]) <= 60
    assert "too many failed logins" in refused.json()["detail"]
    # Counted per address: another client is not locked out.
    assert api_get(token, address="10.1.2.3").status_code == 200
    # A minute later the address may try again.
    later = time.time() + 61
    monkeypatch.setattr(time, "time", lambda: later)
    assert api_get(token).status_code == 200


def test_the_limit_is_shared_by_every_door(member):
    """API, front door and page login count against one budget per address;
    once over it, each door refuses in its own language."""
    _, token = member
    for i in range(LIMIT):
        door = (api_get, front_door, page_login)[i % 3]
        assert door(f"gps_guess{i}").status_code == 401
    api = api_get(token)
    assert api.status_code == 429 and api["Retry-After"]
    openai = front_door(token)
    assert openai.status_code == 429 and openai["Retry-After"]
    assert openai.json()["error"]["code"] == "too_many_failed_logins"
    assert openai.json()["error"]["type"] == "rate_limit_error"
    page = page_login(token)
    assert page.status_code == 429 and b"too many failed logins" in page.content
    assert "gpusched_member_id" not in page.client.session


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_the_websocket_login_is_limited_too(default_tiers, settings):
    settings.GPUSCHED_AUTH_FAILURES_PER_MINUTE = limit = 3  # few connections
    _, token = await database_sync_to_async(factories.member)("ann", "pro")
    try:
        for i in range(limit + 1):
            communicator = WebsocketCommunicator(
                application, "/ws/queue/", headers=[(b"origin", b"http://127.0.0.1")]
            )
            assert (await communicator.connect())[0]
            await communicator.receive_json_from()  # auth_required
            guess = token if i == limit else f"gps_guess{i}"
            await communicator.send_json_to({"type": "auth", "token": guess})
            answer = await communicator.receive_json_from(timeout=5)
            closed = await communicator.receive_output(timeout=5)
            if i < limit:
                assert answer == {"type": "error", "message": "invalid token"}
            else:
                assert "too many failed logins" in answer["message"] and answer["retry_after"]
                assert closed == {"type": "websocket.close", "code": CLOSE_TOO_MANY_FAILURES}
    finally:
        await hub.stop()
        await database_sync_to_async(connections.close_all)()


def test_a_successful_login_writes_nothing(member):
    _, token = member
    api_get(token)  # warm caches (policy, tiers)
    with CaptureQueriesContext(connection) as queries:
        assert api_get(token).status_code == 200
    writes = [q["sql"] for q in queries if not q["sql"].lstrip().upper().startswith("SELECT")]
    assert writes == []


def test_malformed_authorization_headers_are_401_not_500(member):
    for header in ["Bearer", "Bearer ", "Basic abc", "Bearer \x00", "Bearer é" * 100, "x" * 9000]:
        response = Client().get("/api/me/", HTTP_AUTHORIZATION=header)
        assert response.status_code == 401, header


@pytest.mark.e2e
def test_the_limit_holds_across_requests_to_the_real_server(world):
    _, token = factories.member("ann", "pro")
    server = world.start_web(GPUSCHED_AUTH_FAILURES_PER_MINUTE="3")
    with httpx.Client(base_url=server.url, timeout=10) as http:

        def me(key: str) -> httpx.Response:
            return http.get("/api/me/", headers={"Authorization": f"Bearer {key}"})

        assert me(token).status_code == 200
        assert [me(f"gps_guess{i}").status_code for i in range(3)] == [401] * 3
        refused = me(token)
        assert refused.status_code == 429 and refused.headers["Retry-After"]


# --- The admin, CSRF, the Host check, DEBUG ---------------------------------


def test_the_admin_requires_staff(member, client):
    assert client.get("/admin/").status_code == 302  # anonymous: to the login page
    # A member logged in to the pages (even a staff member) is not an operator.
    _, staff_token = factories.member("sam", "max", staff=True)
    assert client.post("/login/", {"token": staff_token, "next": "/"}).status_code == 302
    answer = client.get("/admin/")
    assert answer.status_code == 302 and answer["Location"].startswith("/admin/login/")
    user_model = get_user_model()
    client.force_login(user_model.objects.create_user("carol", password="pw-for-tests"))
    answer = client.get("/admin/queueapp/policy/")
    assert answer.status_code == 302 and answer["Location"].startswith("/admin/login/")
    client.force_login(user_model.objects.create_user("op", password="pw", is_staff=True))
    assert client.get("/admin/").status_code == 200


def test_csrf_protection_is_on_for_session_requests(member):
    _, token = member
    browser = Client(enforce_csrf_checks=True)
    assert browser.post("/login/", {"token": token, "next": "/"}).status_code == 403
    browser.force_login(get_user_model().objects.create_user("op", password="pw", is_staff=True))
    assert browser.post("/logout/").status_code == 403
    assert browser.post("/admin/logout/").status_code == 403
    # The session never authenticates the API: a forged cross-site POST has no token.
    forged = browser.post(
        "/api/jobs/", {"path": "/v1/completions"}, content_type="application/json"
    )
    assert forged.status_code == 401
    assert "django.middleware.csrf.CsrfViewMiddleware" in django_settings.MIDDLEWARE


@pytest.mark.parametrize("path", ["/api/health/", "/v1/chat/completions", "/", "/admin/"])
def test_a_host_not_allowed_is_400(member, path):
    client = FrontDoorClient if path.startswith("/v1/") else Client
    response = client(HTTP_HOST="evil.example").get(path)
    assert response.status_code == 400
    assert b"evil.example" not in response.content


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_the_websocket_refuses_other_sites_origins():
    communicator = WebsocketCommunicator(
        application, "/ws/queue/", headers=[(b"origin", b"https://evil.example")]
    )
    connected, _ = await communicator.connect()
    assert not connected


@pytest.mark.e2e  # starts a process
@pytest.mark.parametrize(("value", "debug"), [(None, "False"), ("1", "True"), ("true", "False")])
def test_debug_is_off_unless_asked_for(value, debug):
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_DEBUG"}
    env["DATABASE_URL"] = database_url()
    if value is not None:
        env["DJANGO_DEBUG"] = value
    shown = subprocess.run(
        [sys.executable, "-c", "from django.conf import settings; print(settings.DEBUG)"],
        cwd=ROOT,
        env={**env, "DJANGO_SETTINGS_MODULE": "gpusched.settings"},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert shown.stdout.strip() == debug


# --- Secrets in logs and error pages ----------------------------------------


@pytest.mark.django_db(transaction=True)  # the delivery is due by the database's clock
def test_secrets_stay_out_of_logs_and_error_pages(member, caplog, settings, monkeypatch, tmp_path):
    owner, token = member
    settings.WEBHOOK_ALLOWED_NETWORKS = ["127.0.0.0/8"]
    settings.LLAMA_SWAP_URL = f"http://127.0.0.1:{free_port()}"  # nobody listens
    caplog.set_level(logging.DEBUG)
    auth = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    answers = [
        Client().get("/api/me/", **auth),  # the one answer that shows the whsec_ secret
        Client().get("/api/me/", HTTP_AUTHORIZATION="Bearer gps_wrong"),
        Client().post("/api/jobs/", {"path": "/x"}, content_type="application/json", **auth),
        Client().post("/login/", {"token": "gps_wrong"}),
        FrontDoorClient().get("/v1/models", **auth),  # llama-swap unreachable: 503
        FrontDoorClient().post(
            "/v1/chat/completions", b"{", content_type="application/json", **auth
        ),
    ]
    # A webhook delivery that fails: the signature is made with the secret.
    job = factories.job(owner)
    job.callback_url = f"http://127.0.0.1:{free_port()}/hook"
    job.save(update_fields=["callback_url"])
    from queueapp import services

    services.job_cancel(job=job, by="test")
    assert deliver_due(budget_seconds=1) >= 1

    # A crash in a view: the 500 answer and the traceback in the log.
    def crash(*args, **kwargs):
        raise RuntimeError("something broke")

    monkeypatch.setattr("queueapp.api.views.MeView.get", crash)
    crashed = Client(raise_request_exception=False).get("/api/me/", **auth)
    assert crashed.status_code == 500 and crashed.json() == {
        "detail": "internal error; it has been logged"
    }
    assert "something broke" in caplog.text  # the log has the traceback...
    secrets = [token, owner.webhook_secret, django_settings.SECRET_KEY]
    for secret in secrets:  # ...but none of the secrets
        assert secret not in caplog.text
        for answer in [*answers[1:], crashed]:
            assert secret.encode() not in answer.content
    assert owner.webhook_secret.encode() in answers[0].content  # the test can see one


@pytest.mark.slow
@pytest.mark.e2e
def test_the_database_password_stays_out_of_logs_and_answers(world, tmp_path):
    """With the database unreachable every call fails; neither the answers nor
    the server's log show DATABASE_URL's password or the SECRET_KEY."""
    password, secret_key = "Db-Pw-7f3a9c1e", "Secret-Key-4b8d2e6a-not-for-logs"
    port = free_port()  # nothing listens: every query fails to connect
    server = world.start_web(
        healthy=False,
        DATABASE_URL=f"postgresql://gpusched:{password}@127.0.0.1:{port}/gpusched",
        DJANGO_SECRET_KEY=secret_key,
    )
    auth = {"Authorization": "Bearer gps_whatever"}
    with httpx.Client(base_url=server.url, timeout=20) as http:
        answers = [
            http.get("/api/health/"),
            http.get("/api/me/", headers=auth),
            http.post("/v1/chat/completions", headers=auth, content=b'{"model": "m"}'),
            http.post("/login/", data={"token": "gps_x"}),
            http.get("/admin/"),
        ]
    assert [answer.status_code for answer in answers] == [503, 503, 503, 403, 302]
    wait_for(lambda: "database unavailable" in server.log_path.read_text(), message="the log line")
    log = server.log_path.read_text(errors="replace")
    for text in [log, *(answer.text for answer in answers)]:
        assert password not in text and secret_key not in text
