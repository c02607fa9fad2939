"""The WebSocket consumer in-process (Channels' WebsocketCommunicator)."""

import pytest
import pytest_asyncio
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.db import connections

from gpusched.asgi import application
from queueapp.live.hub import hub
from tests import factories

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

ORIGIN = [(b"origin", b"http://127.0.0.1")]


@pytest_asyncio.fixture(autouse=True)
async def _stop_hub():
    yield
    await hub.stop()
    # The thread that ran the ORM for the consumer keeps its own connection.
    await database_sync_to_async(connections.close_all)()


async def connect():
    communicator = WebsocketCommunicator(application, "/ws/queue/", headers=ORIGIN)
    connected, _ = await communicator.connect()
    assert connected
    return communicator


async def test_anonymous_viewers_must_authenticate_and_bad_tokens_are_closed(default_tiers):
    communicator = await connect()
    assert (await communicator.receive_json_from())["type"] == "auth_required"
    await communicator.send_json_to({"type": "auth", "token": "gps_wrong"})
    assert (await communicator.receive_json_from())["type"] == "error"
    assert (await communicator.receive_output())["type"] == "websocket.close"


async def test_token_viewers_get_a_redacted_snapshot(default_tiers):
    ann, ann_token = await database_sync_to_async(factories.member)("ann-member", "free")
    bob, _ = await database_sync_to_async(factories.member)("bob-member", "pro")
    await database_sync_to_async(factories.job)(ann, priority="batch")
    await database_sync_to_async(factories.job)(bob, priority="interactive")
    communicator = await connect()
    await communicator.receive_json_from()
    await communicator.send_json_to({"type": "auth", "token": ann_token})
    snapshot = await communicator.receive_json_from(timeout=5)
    assert snapshot["type"] == "snapshot"
    assert [(e["priority"], e["mine"], e["member"]) for e in snapshot["queued"]] == [
        (100, False, None),
        (-100, True, "ann-member"),
    ]
    assert "bob-member" not in str(snapshot)
    await communicator.disconnect()


async def test_public_dashboard_lets_anonymous_viewers_watch(default_tiers):
    await database_sync_to_async(factories.policy)(public_dashboard=True)
    owner, _ = await database_sync_to_async(factories.member)("ann-member", "free")
    await database_sync_to_async(factories.job)(owner)
    communicator = await connect()
    snapshot = await communicator.receive_json_from(timeout=5)
    assert snapshot["type"] == "snapshot" and snapshot["queued"][0]["member"] is None
    await communicator.disconnect()
    assert not hub.viewers


async def test_a_viewer_that_reconnects_is_caught_up_by_its_snapshot(default_tiers):
    owner, token = await database_sync_to_async(factories.member)("ann-member", "free")
    communicator = await connect()
    await communicator.receive_json_from()
    await communicator.send_json_to({"type": "auth", "token": token})
    assert (await communicator.receive_json_from(timeout=5))["queued"] == []
    await communicator.disconnect()
    job = await database_sync_to_async(factories.job)(owner)  # while disconnected
    again = await connect()
    await again.receive_json_from()
    await again.send_json_to({"type": "auth", "token": token})
    snapshot = await again.receive_json_from(timeout=5)
    assert [entry["id"] for entry in snapshot["queued"]] == [job.pk]
    await again.disconnect()
