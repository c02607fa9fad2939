"""Live updates cross processes: the cluster changes a job, the web server's
WebSocket viewers see it, on the embedded default (PostgreSQL NOTIFY) and
with REDIS_URL (channels-redis)."""

import os

import httpx
import pytest

from queueapp.models import Job
from tests import factories
from tests.e2e.helpers import REDIS_URL, Watcher, redis_available

pytestmark = [pytest.mark.e2e]


@pytest.mark.parametrize("layer", ["postgres-notify", "redis"])
def test_viewers_see_each_state_change_made_by_the_cluster_process(world, layer):
    env = {}
    if layer == "redis":
        if not redis_available():
            if os.environ.get("CI"):
                pytest.fail(f"Redis is not reachable at {REDIS_URL}")
            pytest.skip(f"Redis is not reachable at {REDIS_URL}")
        env["REDIS_URL"] = REDIS_URL
    world.start_cluster(**env)
    web = world.start_web(**env)
    member, token = factories.member("ann-member", "free")
    with Watcher(web.url, token) as watcher:
        created = httpx.post(
            f"{web.url}/api/jobs/",
            json={"path": "/v1/chat/completions", "body": factories.chat_body("chat-a", 1.0)},
            headers={"Authorization": f"Bearer {token}"},
        )
        assert created.status_code == 201, created.text
        job_id = created.json()["id"]
        watcher.wait_for_state(job_id, "running")
        shown_gone = watcher.wait_for_state(job_id, "gone")
    job = Job.objects.get(pk=job_id)
    assert job.status == "succeeded"
    # Each change reached the viewer, and not before the database recorded it.
    # How soon is a speed goal: benchmarks/websocket_fanout.py's "within 1 s".
    assert shown_gone >= job.finished_at.timestamp() - 0.5
