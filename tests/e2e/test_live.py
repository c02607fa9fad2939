"""Live updates cross processes: the cluster changes a job, the web server's
WebSocket viewers see it, on the embedded default (PostgreSQL NOTIFY) and
with REDIS_URL (channels-redis)."""

import json
import os
import time

import httpx
import pytest
import redis
from websockets.sync.client import connect

from queueapp.models import Job
from tests import factories

pytestmark = [pytest.mark.e2e]
REDIS_URL = os.environ.get("GPUSCHED_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")


def redis_available() -> bool:
    try:
        return bool(redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1).ping())
    except redis.RedisError:
        return False


class Watcher:
    """A WebSocket viewer that records when it saw each state of a job."""

    def __init__(self, base_url: str, token: str) -> None:
        host = base_url.removeprefix("http://")
        self._connection = connect(f"ws://{host}/ws/queue/", origin=base_url, open_timeout=10)
        self.token = token

    def __enter__(self) -> "Watcher":
        self.socket = self._connection.__enter__()
        assert json.loads(self.socket.recv(timeout=10))["type"] == "auth_required"
        self.socket.send(json.dumps({"type": "auth", "token": self.token}))
        self.state = json.loads(self.socket.recv(timeout=10))
        assert self.state["type"] == "snapshot"
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._connection.__exit__(*exc_info)

    def state_of(self, job_id: int) -> str:
        if any(entry["id"] == job_id for entry in self.state.get("running_all") or []):
            return "running"
        if self.state["running"] and self.state["running"]["id"] == job_id:
            return "running"
        if any(entry["id"] == job_id for entry in self.state["queued"]):
            return "queued"
        return "gone"

    def wait_for_state(self, job_id: int, wanted: str, timeout: float = 15) -> float:
        """Returns the wall-clock time the update showing `wanted` arrived."""
        deadline = time.monotonic() + timeout
        while self.state_of(job_id) != wanted:
            left = deadline - time.monotonic()
            if left <= 0:
                pytest.fail(f"job {job_id} never showed as {wanted} on the live view")
            self.receive(timeout=left)
        return time.time()

    def receive(self, timeout: float) -> None:
        """The next message: a full state, or a delta applied to the one held."""
        message = json.loads(self.socket.recv(timeout=timeout))
        if message["type"] == "delta":
            assert message["base"] == self.state["version"], "a version was skipped"
            self.state = {**self.state, **message["changes"], "version": message["version"]}
        else:
            self.state = message


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
        shown_running = watcher.wait_for_state(job_id, "running")
        shown_gone = watcher.wait_for_state(job_id, "gone")
    job = Job.objects.get(pk=job_id)
    assert job.status == "succeeded"
    # Each change reached the viewer within 2 s of the database recording it.
    assert shown_running - job.started_at.timestamp() < 2.0
    assert shown_gone - job.finished_at.timestamp() < 2.0
    assert shown_gone >= job.finished_at.timestamp() - 0.5
