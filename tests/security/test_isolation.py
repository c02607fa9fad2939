"""Member isolation: another member's jobs, chains and webhooks do not exist
for you (404), on every URL the project serves, and their names, bodies,
callbacks and chains never reach you (REST, pages, WebSocket).

The URLs come from the URLconf itself, so an endpoint added later is covered
(or the test names the URL parameter it does not know how to fill).
"""

from __future__ import annotations

import pytest
import pytest_asyncio
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.db import connections
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver

from gpusched.asgi import application
from queueapp.live.hub import hub
from queueapp.models import Job, JobStatus, WebhookDelivery
from tests import factories
from tests.security.conftest import Owner, Population

METHODS = ("get", "post", "put", "patch", "delete")
ADMIN_PREFIX = "admin/"  # staff only: tests/security/test_auth_hardening.py
# URL parameters that name no member's object: a model is shared, and only
# staff change its settings (tests/api/test_models.py).
NOT_OWNED = {"name"}


def routes(patterns=None, prefix: str = "") -> list[tuple[str, URLPattern]]:
    """Every route of the URLconf as (route text, pattern), includes expanded."""
    found = []
    for entry in get_resolver().url_patterns if patterns is None else patterns:
        route = prefix + str(entry.pattern)
        if isinstance(entry, URLResolver):
            if not route.startswith(ADMIN_PREFIX):
                found += routes(entry.url_patterns, route)
        else:
            found.append((route, entry))
    return found


def foreign_values(owner: Owner) -> dict[str, list]:
    """For each URL parameter name, the values that point at `owner`'s objects."""
    return {"job_id": owner.job_ids, "chain_id": owner.chains}


def secrets_of(owner: Owner) -> list[str]:
    """Strings only `owner`'s data contains: the name (which the bodies'
    labels, the callback URL and the chain id start with, see conftest.py),
    the webhook secret and the token."""
    return [owner.member.name, owner.member.webhook_secret, owner.token, *owner.chains]


def fill(route: str, values: dict[str, object]) -> str:
    path = route
    for name, value in values.items():
        for converter in ("int", "str", "slug", "path"):
            path = path.replace(f"<{converter}:{name}>", str(value))
        path = path.replace(f"<{name}>", str(value))
    assert "<" not in path, f"{route}: a parameter this test cannot fill"
    return "/" + path


def as_member(owner: Owner) -> Client:
    """A client logged in to the pages (session) that also sends the token."""
    client = Client(HTTP_AUTHORIZATION=f"Bearer {owner.token}")
    assert client.post("/login/", {"token": owner.token, "next": "/"}).status_code == 302
    return client


def assert_no_leak(response, owner: Owner, where: str) -> None:
    content = b"".join(response.streaming_content) if response.streaming else response.content
    text = content.decode(errors="replace")
    for secret in secrets_of(owner):
        assert secret not in text, f"{where}: {secret!r} of {owner.member.name} leaked"


def test_every_url_with_an_id_is_404_for_another_members_objects(population: Population):
    ann, bob = population.ann, population.bob
    client = as_member(ann)
    before = {job.pk: job.status for job in Job.objects.filter(member=bob.member)}
    deliveries = WebhookDelivery.objects.filter(job__member=bob.member).count()
    with_ids, asked = [], 0
    for route, pattern in routes():
        names = list(pattern.pattern.converters)
        if not names or set(names) <= NOT_OWNED:
            continue
        unknown = set(names) - set(foreign_values(bob))
        assert not unknown, f"{route}: no foreign value known for {unknown}; add it here"
        with_ids.append(route)
        for name in names:
            for value in foreign_values(bob)[name]:
                path = fill(route, {name: value})
                answers = {method: getattr(client, method)(path) for method in METHODS}
                asked += len(answers)
                for method, response in answers.items():
                    assert response.status_code in (404, 405), (method, path, response.status_code)
                    assert_no_leak(response, bob, f"{method.upper()} {path}")
                assert 404 in {r.status_code for r in answers.values()}, path
    # Every kind of id-taking route was reached: jobs, result, why (API and
    # page), webhook redelivery, chains.
    assert len(with_ids) >= 6, with_ids
    assert asked >= 6 * len(METHODS)
    # Nothing of bob's changed: no cancel, no redelivery.
    assert {job.pk: job.status for job in Job.objects.filter(member=bob.member)} == before
    assert WebhookDelivery.objects.filter(job__member=bob.member).count() == deliveries
    assert Job.objects.filter(member=bob.member, status=JobStatus.QUEUED).count() == 2


def test_the_same_urls_serve_the_owner(population: Population):
    """The other side of the 404s above: the owner reaches each object, so the
    404 means "not yours", not "broken"."""
    ann = population.ann
    client = as_member(ann)
    reached = 0
    for route, pattern in routes():
        names = list(pattern.pattern.converters)
        if names and "webhook" not in route and not set(names) <= NOT_OWNED:
            value = foreign_values(ann)[names[0]][0 if names[0] == "chain_id" else 1]
            response = client.get(fill(route, {names[0]: value}))
            assert response.status_code == 200, (route, response.status_code)
            reached += 1
    assert reached >= 5


def test_urls_without_ids_never_show_another_members_data(population: Population):
    ann, bob = population.ann, population.bob
    client = as_member(ann)
    swept = []
    for route, pattern in routes():
        if pattern.pattern.converters:
            continue
        path = fill(route, {})
        response = client.get(path)
        assert response.status_code < 500, (path, response.status_code)
        assert_no_leak(response, bob, f"GET {path}")
        swept.append(path)
    assert {"/api/jobs/", "/api/queue/", "/api/chains/", "/api/me/", "/"} <= set(swept), swept


def test_the_queue_shows_other_members_jobs_without_names_or_bodies(population: Population):
    ann, bob = population.ann, population.bob
    response = as_member(ann).get("/api/queue/")
    assert_no_leak(response, bob, "GET /api/queue/")
    queue = response.json()
    others = [entry for entry in [queue["running"], *queue["queued"]] if not entry["mine"]]
    assert {entry["id"] for entry in others} == {
        job.pk for job in Job.objects.filter(member=bob.member, status__in=["queued", "running"])
    }
    assert all(entry["member"] is None and entry["path"] is None for entry in others)
    assert all(entry["chain"] is None for entry in others)
    assert not [chain for chain in queue["chains"] if not chain["mine"]]


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
class TestWebSocket:
    @pytest_asyncio.fixture(autouse=True)
    async def _stop_hub(self):
        yield
        await hub.stop()
        await database_sync_to_async(connections.close_all)()

    async def test_other_members_jobs_come_without_names_or_bodies(self, population):
        ann, bob = population.ann, population.bob
        communicator = WebsocketCommunicator(
            application, "/ws/queue/", headers=[(b"origin", b"http://127.0.0.1")]
        )
        assert (await communicator.connect())[0]
        assert (await communicator.receive_json_from())["type"] == "auth_required"
        await communicator.send_json_to({"type": "auth", "token": ann.token})
        snapshot = await communicator.receive_output(timeout=10)
        bobs = {
            entry["id"]
            for entry in [snapshot_json(snapshot)["running"], *snapshot_json(snapshot)["queued"]]
            if not entry["mine"]
        }
        assert bobs and bobs <= set(bob.job_ids)
        for secret in [*secrets_of(bob), "bob-secret"]:
            assert secret not in snapshot["text"], secret
        assert "ann-secret-name" in snapshot["text"]  # her own jobs carry her name
        # An update after bob's next submission is redacted the same way.
        await database_sync_to_async(factories.job)(bob.member, label="bob-secret-new")
        update = await communicator.receive_output(timeout=10)
        assert snapshot_json(update)["type"] == "delta"
        for secret in [*secrets_of(bob), "bob-secret"]:
            assert secret not in update["text"], secret
        await communicator.disconnect()


def snapshot_json(message: dict) -> dict:
    import json

    return json.loads(message["text"])
