"""The WebSocket consumer in-process (Channels' WebsocketCommunicator)."""

import json

import pytest
import pytest_asyncio
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.db import connections

from gpusched.asgi import application
from queueapp.live.hub import hub
from tests import factories

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.asyncio,
    pytest.mark.database_server,
]

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


async def connect_as(token):
    """Connected and authenticated: (communicator, its snapshot)."""
    communicator = await connect()
    assert (await communicator.receive_json_from())["type"] == "auth_required"
    await communicator.send_json_to({"type": "auth", "token": token})
    return communicator, await communicator.receive_json_from(timeout=5)


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
    communicator, snapshot = await connect_as(ann_token)
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
    communicator, snapshot = await connect_as(token)
    assert snapshot["queued"] == []
    await communicator.disconnect()
    job = await database_sync_to_async(factories.job)(owner)  # while disconnected
    again, snapshot = await connect_as(token)
    assert [entry["id"] for entry in snapshot["queued"]] == [job.pk]
    await again.disconnect()


async def test_after_the_snapshot_a_viewer_gets_deltas_that_rebuild_the_state(default_tiers):
    owner, token = await database_sync_to_async(factories.member)("ann-member", "free")
    await database_sync_to_async(factories.job)(owner, priority="batch")
    communicator, held = await connect_as(token)
    assert held["type"] == "snapshot"
    for _ in range(2):
        job = await database_sync_to_async(factories.job)(owner, priority="interactive")
        delta = await communicator.receive_json_from(timeout=5)
        assert delta["type"] == "delta" and delta["base"] == held["version"]
        # Only what changed travels: the policy flags did not.
        assert "queued" in delta["changes"] and "dispatch_paused" not in delta["changes"]
        held = {**held, **delta["changes"], "version": delta["version"]}
        assert job.pk in [entry["id"] for entry in held["queued"]]
    fresh, snapshot = await connect_as(token)
    assert {**held, "type": "snapshot"} == snapshot
    await communicator.disconnect()
    await fresh.disconnect()


async def test_a_viewer_behind_by_more_than_one_version_gets_the_full_state(default_tiers):
    from queueapp.live.consumers import QueueConsumer

    owner, _ = await database_sync_to_async(factories.member)("ann-member", "free")
    await database_sync_to_async(factories.job)(owner)
    viewer = QueueConsumer()
    sent = []

    async def send(text_data):
        sent.append(json.loads(text_data))

    viewer.send = send
    await hub.join(viewer)
    await hub._rebuild()  # two versions on, with a state one version back
    await database_sync_to_async(factories.job)(owner)
    await hub._rebuild()
    for behind, expected in [(3, "update"), (1, "delta"), (0, None)]:
        viewer.sent_version = hub.version - behind
        sent.clear()
        await viewer.push()
        assert [message["type"] for message in sent] == ([expected] if expected else [])
    hub.leave(viewer)


async def test_the_live_state_lists_the_head_and_the_viewers_own_jobs_further_back(
    default_tiers, monkeypatch
):
    from queueapp import dashboard

    monkeypatch.setattr(dashboard, "LIVE_QUEUE_HEAD", 3)
    monkeypatch.setattr(dashboard, "LIVE_OWN_FURTHER", 2)
    ann, token = await database_sync_to_async(factories.member)("ann-member", "free")
    bob, _ = await database_sync_to_async(factories.member)("bob-member", "pro")
    for _ in range(5):
        await database_sync_to_async(factories.job)(bob, priority="interactive")
    own = [await database_sync_to_async(factories.job)(ann) for _ in range(3)]
    communicator, snapshot = await connect_as(token)
    listed = [(entry["position"], entry["id"]) for entry in snapshot["queued"]]
    # Bob's first three, then two of ann's (the third is past the limit).
    assert [position for position, _ in listed] == [1, 2, 3, 6, 7]
    assert [job_id for _, job_id in listed[3:]] == [own[0].pk, own[1].pk]
    assert snapshot["queued_total"] == 8
    assert [(m["member"], m["mine"], m["queued"]) for m in snapshot["members"]] == [
        (None, False, 5),
        ("ann-member", True, 3),
    ]
    await communicator.disconnect()


async def answer_to_request(communicator):
    """The next message that answers a request: the jobs' NOTIFYs reach the
    hub when they do (later on a busy machine), and the deltas they bring
    may come first."""
    while (message := await communicator.receive_json_from(timeout=5))["type"] in LIVE_CHANGES:
        pass
    return message


LIVE_CHANGES = ("delta", "update")


async def test_a_viewer_reads_further_back_a_page_at_a_time(default_tiers):
    ann, token = await database_sync_to_async(factories.member)("ann-member", "free")
    bob, _ = await database_sync_to_async(factories.member)("bob-member", "pro")
    jobs = [await database_sync_to_async(factories.job)(bob) for _ in range(4)]
    jobs.append(await database_sync_to_async(factories.job)(ann, priority="batch"))
    communicator, _ = await connect_as(token)
    await communicator.send_json_to({"type": "queue_page", "offset": 2, "limit": 5})
    page = await answer_to_request(communicator)
    assert page["type"] == "queue_page" and (page["offset"], page["limit"]) == (2, 5)
    assert [entry["position"] for entry in page["queued"]] == [3, 4, 5]
    assert [entry["id"] for entry in page["queued"]] == [job.pk for job in jobs[2:]]
    assert [(entry["member"], entry["mine"]) for entry in page["queued"]] == [
        (None, False),
        (None, False),
        ("ann-member", True),
    ]
    await communicator.send_json_to({"type": "queue_page", "offset": -1})
    refused = await answer_to_request(communicator)
    assert refused["type"] == "error" and refused["field"] == "offset"
    await communicator.disconnect()
