"""`make run` as a user runs it: one command, a job over real HTTP, Ctrl-C stops all."""

import os
import re
import signal
import subprocess
import sys
import uuid

import httpx
import psycopg
import pytest

from tests.e2e.conftest import ROOT, database_url, free_port, wait_for

pytestmark = [pytest.mark.e2e]


@pytest.fixture
def fresh_database(db):
    """An empty database of its own, as on a first `make run`."""
    name = f"gpusched_run_{uuid.uuid4().hex[:8]}"
    admin_url = database_url().rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    yield database_url().rsplit("/", 1)[0] + f"/{name}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def test_run_all_serves_a_job_end_to_end_and_stops_on_ctrl_c(fresh_database, tmp_path):
    port, simulator_port = free_port(), free_port()
    env = dict(
        os.environ,
        DATABASE_URL=fresh_database,
        PORT=str(port),
        SIMULATOR_PORT=str(simulator_port),
        PYTHONUNBUFFERED="1",
    )
    env.pop("LLAMA_SWAP_URL", None)
    output = tmp_path / "run_all.log"
    with output.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, "manage.py", "run_all"],
            cwd=ROOT,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        text = wait_for(
            lambda: "Press Ctrl-C" in output.read_text() and output.read_text(),
            timeout=90,
            what="run_all to print its banner",
        )
        token = re.search(r"demo member token:\s+(\S+)", text).group(1)
        base = f"http://127.0.0.1:{port}"
        headers = {"Authorization": f"Bearer {token}", "X-LlamaSwap-Priority": "interactive"}
        body = {"model": "chat-small", "messages": [{"role": "user", "content": "hello"}]}
        created = httpx.post(
            f"{base}/api/jobs/",
            json={"path": "/v1/chat/completions", "body": body},
            headers=headers,
        )
        assert created.status_code == 201, created.text + output.read_text()[-3000:]
        job_url = f"{base}/api/jobs/{created.json()['id']}/"
        job = wait_for(
            lambda: (
                (answer := httpx.get(job_url, headers=headers).json())["status"] == "succeeded"
                and answer
            ),
            what=f"the job to come back from the simulator (run_all's output: {output})",
        )
        assert job["result"]["body"]["model"] == "chat-small"
        assert httpx.get(f"{base}/admin/login/").status_code == 200
    finally:
        process.send_signal(signal.SIGINT)  # what Ctrl-C delivers
        process.wait(timeout=40)
    assert process.returncode == 0, output.read_text()[-3000:]
    leftovers = subprocess.run(
        ["pgrep", "-f", f"--port {simulator_port}|-p {port} "], capture_output=True, text=True
    )
    assert leftovers.stdout == "", "run_all left children running"
