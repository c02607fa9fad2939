"""Real processes for end-to-end tests: the django-q2 GPU cluster and the simulator.

The tests run against the test database with committed transactions
(`transactional_db`), so the cluster process sees what the test writes.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import psycopg
import pytest
from django.db import connection

from gpusched.server_limits import daphne_command
from queueapp.dispatch.wakeup import WORK_CHANNEL
from queueapp.upstream.simulator import LlamaSwapSimulator
from tests import factories

ROOT = Path(__file__).resolve().parents[2]
DEADLINE_SECONDS = 30.0
POLL_SECONDS = 0.02


def wait_for(predicate: Callable[[], Any], *, timeout: float = DEADLINE_SECONDS, what: str) -> Any:
    """Poll until `predicate()` is truthy; fail with `what` after the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(POLL_SECONDS)  # between checks of the state, up to the deadline


def sessions_waiting_on_locks() -> int:
    """How many sessions of this test database wait for a lock right now."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return cursor.fetchone()[0]


def dispatchers_listening() -> int:
    """Dispatch passes of this test database sleeping on the work channel
    (on a connection of its own: module-scoped fixtures have no database access)."""
    with psycopg.connect(database_url(), autocommit=True) as probe:
        return probe.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND query = %s",
            [f"LISTEN {WORK_CHANNEL}"],
        ).fetchone()[0]


def database_url() -> str:
    """A DATABASE_URL for the test database this process uses."""
    db = connection.settings_dict
    credentials = quote(db["USER"] or "", safe="")
    if db.get("PASSWORD"):
        credentials += ":" + quote(db["PASSWORD"], safe="")
    host = quote(db["HOST"] or "localhost", safe="")
    port = f":{db['PORT']}" if db.get("PORT") else ""
    return f"postgresql://{credentials}@{host}{port}/{db['NAME']}"


class GpuCluster:
    """`manage.py qcluster` in its own process group, so a kill takes all of it."""

    def __init__(
        self, upstream_url: str, log_path: Path, media_root: Path, extra_env: dict | None = None
    ) -> None:
        self.upstream_url = upstream_url
        self.log_path = log_path
        self.media_root = media_root
        self.extra_env = extra_env or {}
        self.process: subprocess.Popen | None = None

    def start(self) -> GpuCluster:
        env = dict(
            os.environ,
            DATABASE_URL=database_url(),
            LLAMA_SWAP_URL=self.upstream_url,
            GPUSCHED_QUEUE_POLL="0.05",
            GPUSCHED_MEDIA_ROOT=str(self.media_root),
            PYTHONUNBUFFERED="1",
        )
        env.update(self.extra_env)  # may name another database
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "manage.py", "qcluster"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        return self

    def kill(self) -> None:
        """SIGKILL the whole cluster: no cleanup, as in a crash."""
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        # As Ctrl-C would: the main process stops the cluster in order and the
        # worker's dispatch pass stops claiming (see queueapp/dispatch/wakeup.py).
        os.killpg(self.process.pid, signal.SIGINT)
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")


@pytest.fixture
def simulator() -> Iterator[LlamaSwapSimulator]:
    sim = LlamaSwapSimulator(
        models={"chat-a": 0.05, "chat-b": 0.05},
        default_seconds=0.05,
        accept_any_model=True,
        swap_seconds=0.1,
    ).start()
    yield sim
    sim.stop()


class WebServer:
    def __init__(self, upstream_url: str, log_path: Path, extra_env: dict) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(
            os.environ,
            DATABASE_URL=database_url(),
            LLAMA_SWAP_URL=upstream_url,
            GPUSCHED_DB_POOL="20",  # as `make run` starts it
            PYTHONUNBUFFERED="1",
        )
        env.update(extra_env)  # may name another database
        self._argv = daphne_command(sys.executable, port=self.port, access_log=True)
        self._env = env
        self.log_path = log_path
        self.process: subprocess.Popen | None = None

    def start(self) -> WebServer:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self._argv, cwd=ROOT, env=self._env, stdout=log, stderr=subprocess.STDOUT
            )
        wait_for(self._healthy, what=f"the web server on port {self.port}")
        return self

    def _healthy(self) -> bool:
        try:
            return httpx.get(f"{self.url}/api/health/", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class World:
    """The simulator plus the GPU clusters a test starts (all stopped at teardown)."""

    def __init__(self, simulator: LlamaSwapSimulator, log_dir: Path) -> None:
        self.simulator = simulator
        self.log_dir = log_dir
        self.media_root = log_dir / "media"
        self.clusters: list[GpuCluster] = []
        self.servers: list[WebServer] = []

    def start_cluster(self, upstream_url: str | None = None, **extra_env: str) -> GpuCluster:
        log_path = self.log_dir / f"cluster-{len(self.clusters)}.log"
        cluster = GpuCluster(
            upstream_url or self.simulator.url, log_path, self.media_root, extra_env
        )
        cluster.start()
        self.clusters.append(cluster)
        if "DATABASE_URL" not in extra_env:
            # A dispatch pass is up and hears new work: a test's first job is
            # not timed against the cluster's start-up. (A second cluster
            # starts none while the first one's pass runs.)
            wait_for(
                lambda: dispatchers_listening() > 0,
                what="the new cluster's dispatch pass to listen for work",
            )
        return cluster

    def start_web(self, **extra_env: str) -> WebServer:
        """Daphne serving the app (HTTP and WebSocket) in its own process."""
        server = WebServer(self.simulator.url, self.log_dir / "web.log", extra_env).start()
        self.servers.append(server)
        return server

    def served(self) -> list[dict]:
        """The simulator's successful requests in arrival order."""
        return [entry for entry in self.simulator.log() if entry["status"] == 200]

    def served_labels(self) -> list[str]:
        return [entry["body"]["user"] for entry in self.served()]


@pytest.fixture
def world(transactional_db, simulator, tmp_path) -> Iterator[World]:
    """Tiers and policy as the fixtures define them, and the simulator; no cluster yet."""
    factories.policy()
    factories.tiers()
    world = World(simulator, tmp_path)
    yield world
    for process in [*world.servers, *world.clusters]:
        process.stop()
