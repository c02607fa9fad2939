"""PostgreSQL restarts under a running system: the web server and the
dispatcher recover by themselves, no job is lost and none runs twice.

The system runs on a PostgreSQL server of the test's own (pgserver's
binaries), so stopping it cannot disturb other tests: once as the embedded
default reaches it (DATABASE_URL unset, a Unix socket under the data folder)
and once as a server over TCP (DATABASE_URL).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import httpx
import psycopg
import pytest

from gpusched import embedded_db
from gpusched.stack import ROOT, Stack, free_port, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.database_server, pytest.mark.slow]

OUTAGE_DEADLINE_SECONDS = 60.0


class OwnPostgres:
    """A PostgreSQL server this test may stop and start at will."""

    def __init__(self, data_dir: Path, kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
        self.data_dir = data_dir
        self.kind = kind
        self.port = free_port()
        # The embedded default finds its server through this variable, in this
        # process (to start and stop it) and in the system's processes.
        monkeypatch.setenv("GPUSCHED_PGDATA", str(data_dir))
        self.socket_url = embedded_db.ensure_running()  # initdb on the first call
        self.url = self.socket_url
        if kind == "server":
            embedded_db.stop()
            self.start()
            self.url = f"postgresql://postgres@127.0.0.1:{self.port}/{embedded_db.DATABASE_NAME}"

    def env(self) -> dict[str, str]:
        """What the system's processes get: DATABASE_URL unset for the embedded default."""
        if self.kind == "embedded":
            return {"DATABASE_URL": "", "GPUSCHED_PGDATA": str(self.data_dir)}
        return {"DATABASE_URL": self.url}

    def stop(self) -> None:
        self._pg_ctl("-m", "fast", "stop")  # every session is cut

    def start(self) -> None:
        if self.kind == "embedded":
            embedded_db.ensure_running()
            return
        options = f"-h 127.0.0.1 -p {self.port} -k {self.data_dir}"
        self._pg_ctl("-o", options, "-l", str(self.data_dir / "server.log"), "start")

    def _pg_ctl(self, *args: str) -> None:
        from pgserver._commands import pg_ctl

        # As root, pgserver runs PostgreSQL as its own user (PostgreSQL refuses root).
        user = "pgserver" if os.geteuid() == 0 else None
        pg_ctl(["-w", *args], pgdata=self.data_dir, user=user)

    def count(self, sql: str, *params: object) -> int:
        with psycopg.connect(self.url, connect_timeout=5) as connection:
            return connection.execute(sql, params).fetchone()[0]


@pytest.fixture(params=["embedded", "server"])
def own_postgres(request, monkeypatch):
    # Under ./var/ like the embedded default's own folder: pytest keeps its
    # temporary folders private to the user, which PostgreSQL's user (as
    # root: pgserver's) cannot enter.
    data_dir = ROOT / "var" / f"restart-test-{uuid.uuid4().hex[:8]}"
    server = OwnPostgres(data_dir, request.param, monkeypatch)
    yield server
    server.stop()
    shutil.rmtree(data_dir, ignore_errors=True)


def manage(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def health(url: str) -> int | None:
    try:
        return httpx.get(f"{url}/api/health/", timeout=5).status_code
    except httpx.TransportError:
        return None


def system_on(own_postgres: OwnPostgres, simulator, tmp_path: Path) -> tuple[str, Stack]:
    """A migrated database with the fixtures and a member, and the stack to
    run on it (nothing started yet); the member's token and the stack."""
    env = {**os.environ, **own_postgres.env()}
    manage(env, "migrate", "--verbosity", "0")
    manage(env, "loaddata", "tiers", "policy")
    token = manage(env, "createmember", "ann", "--tier", "free").strip().splitlines()[-1]
    stack = Stack(
        database_url=own_postgres.url,
        log_dir=tmp_path,
        upstream_url=simulator.url,
        media_root=tmp_path / "media",
        access_log=True,
        env=own_postgres.env(),
    )
    return token, stack


def served(simulator, label: str) -> list[dict]:
    """The simulator's log entries of the request labelled `label`."""
    return [e for e in simulator.log() if e["body"].get("user") == label]


def test_the_system_rides_out_a_postgresql_restart(own_postgres, simulator, tmp_path):
    token, stack = system_on(own_postgres, simulator, tmp_path)
    cluster = stack.start_cluster()
    web = stack.start_web()
    headers = {"Authorization": f"Bearer {token}"}

    def submit(label: str, seconds: float) -> httpx.Response:
        body = {"model": "chat-a", "user": label, "sim": {"seconds": seconds}, "messages": []}
        return httpx.post(
            f"{web.url}/api/jobs/",
            json={"path": "/v1/chat/completions", "body": body},
            headers=headers,
            timeout=10,
        )

    try:
        crossing = submit("crossing", 2.0).json()["id"]  # runs across the outage
        waiting = submit("waiting", 0.05).json()["id"]  # queued across the outage
        wait_for(lambda: served(simulator, "crossing"), message="the first job to reach llama-swap")

        own_postgres.stop()
        down = httpx.get(f"{web.url}/api/health/", timeout=10)
        assert down.status_code == 503 and down.json()["database"].startswith("unavailable")
        refused = submit("during", 0.05)
        assert refused.status_code == 503, refused.text
        assert refused.headers["Retry-After"] and "database is unavailable" in refused.text
        # llama-swap answers while the database is away: the answer must be kept.
        wait_for(
            lambda: served(simulator, "crossing")[0]["finished_at"] is not None,
            message="llama-swap to answer the running job during the outage",
        )
        own_postgres.start()

        wait_for(
            lambda: health(web.url) == 200,
            timeout=OUTAGE_DEADLINE_SECONDS,
            message="the web server to answer again without a restart",
        )
        after = submit("after", 0.05)
        assert after.status_code == 201, after.text
        wait_for(
            lambda: (
                own_postgres.count(
                    "SELECT count(*) FROM queueapp_job WHERE status = %s", "succeeded"
                )
                == 3
            ),
            timeout=OUTAGE_DEADLINE_SECONDS,
            message=f"all three jobs to succeed (cluster log: {cluster.log_path})",
        )
    finally:
        stack.stop()

    # Nothing lost, nothing run twice: each body reached llama-swap once, and
    # the job that ran across the outage kept its answer (one attempt).
    assert [
        len(served(simulator, label)) for label in ("crossing", "waiting", "during", "after")
    ] == [
        1,
        1,
        0,
        1,
    ]
    assert own_postgres.count("SELECT count(*) FROM queueapp_job") == 3
    assert own_postgres.count("SELECT attempts FROM queueapp_job WHERE id = %s", crossing) == 1
    assert (
        own_postgres.count(
            "SELECT count(*) FROM queueapp_jobevent WHERE job_id = %s AND kind = 'requeued'",
            waiting,
        )
        == 0
    )


def test_a_front_door_call_rides_out_a_postgresql_restart(own_postgres, simulator, tmp_path):
    """A call whose answer comes while PostgreSQL is away gets it at once, and
    its job's end is written when the database is back; a call waiting in
    the queue meanwhile is not taken for one whose caller left."""
    token, stack = system_on(own_postgres, simulator, tmp_path)
    stack.start_cluster()
    web = stack.start_web()
    answers: dict[str, httpx.Response] = {}

    def call(label: str, seconds: float) -> threading.Thread:
        def run() -> None:
            answers[label] = httpx.post(
                f"{web.url}/v1/chat/completions",
                json={
                    "model": "chat-a",
                    "user": label,
                    "sim": {"seconds": seconds},
                    "messages": [],
                },
                headers={"Authorization": f"Bearer {token}"},
                timeout=OUTAGE_DEADLINE_SECONDS,
            )

        thread = threading.Thread(target=run)
        thread.start()
        return thread

    def answered(thread: threading.Thread, label: str) -> int:
        thread.join(OUTAGE_DEADLINE_SECONDS)
        assert not thread.is_alive(), f"no answer to {label}"
        return answers[label].status_code

    try:
        crossing = call("fd-crossing", 2.0)  # answered during the outage
        wait_for(lambda: served(simulator, "fd-crossing"), message="the call to reach llama-swap")
        waiting = call("fd-waiting", 0.05)  # queued behind it, across the outage
        wait_for(
            lambda: own_postgres.count("SELECT count(*) FROM queueapp_job") == 2,
            message="the second call's job to queue",
        )
        own_postgres.stop()
        assert answered(crossing, "fd-crossing") == 200  # while the database is away
        # Its end could not be written: the web process says it tries again.
        wait_for(
            lambda: "writing its end again" in web.log_text(),
            timeout=OUTAGE_DEADLINE_SECONDS,
            message="the web process to retry the job's end",
        )
        own_postgres.start()
        assert answered(waiting, "fd-waiting") == 200
        wait_for(
            lambda: (
                own_postgres.count(
                    "SELECT count(*) FROM queueapp_job WHERE status = %s", "succeeded"
                )
                == 2
            ),
            timeout=OUTAGE_DEADLINE_SECONDS,
            message=f"both jobs to be written as succeeded (web log: {web.log_path})",
        )
    finally:
        stack.stop()
    assert [len(served(simulator, label)) for label in ("fd-crossing", "fd-waiting")] == [1, 1]
    assert (
        own_postgres.count(
            "SELECT count(*) FROM queueapp_job WHERE result_body IS NOT NULL AND attempts = 1"
        )
        == 2
    )
