"""`make run` as a user runs it: one command, a job over real HTTP, Ctrl-C stops all.

It runs as on a fresh machine: DATABASE_URL unset, so run_all starts the
embedded PostgreSQL, here in a data folder of the test's own (GPUSCHED_PGDATA)
that nothing else uses, and Ctrl-C must stop that server too.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from pathlib import Path

import httpx
import pytest

from gpusched import embedded_db
from tests.e2e.conftest import ROOT, free_port, wait_for

pytestmark = [pytest.mark.e2e]

# run_all gives its children 15 s to stop before it kills them; the rest of a
# process tree (orphans reparented to init) must be gone soon after.
RUN_ALL_STOP_SECONDS = 40
LEFTOVER_DEADLINE_SECONDS = 10

# A process by pid and start time (clock ticks since boot): a pid reused by
# an unrelated process after ours ended is not ours.
Process = tuple[int, str]


def process_table() -> dict[int, tuple[int, str, str]]:
    """pid -> (parent pid, state, start time) of every process, from /proc."""
    table = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # ended while the table was read
        # The command name (field 2) is in parentheses and may hold spaces.
        fields = stat[stat.rindex(")") + 2 :].split()
        table[int(entry.name)] = (int(fields[1]), fields[0], fields[19])
    return table


def process_tree(*roots: int) -> set[Process]:
    """The processes `roots` and all their descendants, as they are now."""
    table = process_table()
    children = defaultdict(list)
    for pid, (parent, _, _) in table.items():
        children[parent].append(pid)
    found, todo = set(), list(roots)
    while todo:
        pid = todo.pop()
        if pid in table:
            found.add((pid, table[pid][2]))
            todo += children[pid]
    return found


def alive(processes: set[Process]) -> list[int]:
    """Those of `processes` still running (a zombie has ended: it only awaits
    its parent's wait, and a container's init may never reap it)."""
    table = process_table()
    return sorted(
        pid
        for pid, started in processes
        if pid in table and table[pid][2] == started and table[pid][1] != "Z"
    )


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return "(gone)"


def postmaster_pid(data_dir: Path) -> int | None:
    try:
        return int((data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return None


@pytest.fixture
def own_data_dir(monkeypatch):
    """A data folder for run_all's embedded PostgreSQL, as `make run` makes one
    under ./var/ (pytest's own temporary folders are private to the user, and
    as root PostgreSQL runs as pgserver's user)."""
    data_dir = ROOT / "var" / f"run-all-test-{uuid.uuid4().hex[:8]}"
    # For embedded_db.stop() below, should run_all have left its server running.
    monkeypatch.setenv("GPUSCHED_PGDATA", str(data_dir))
    yield data_dir
    embedded_db.stop()
    shutil.rmtree(data_dir, ignore_errors=True)


def test_run_all_serves_a_job_end_to_end_and_ctrl_c_stops_every_process(own_data_dir, tmp_path):
    port, simulator_port = free_port(), free_port()
    env = dict(
        os.environ,
        GPUSCHED_PGDATA=str(own_data_dir),
        PORT=str(port),
        SIMULATOR_PORT=str(simulator_port),
        PYTHONUNBUFFERED="1",
    )
    env.pop("DATABASE_URL", None)  # the embedded PostgreSQL, as on a fresh machine
    env.pop("LLAMA_SWAP_URL", None)  # and the built-in simulator
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
    started = process_tree(process.pid)  # run_all's tree, then the server's
    server_tree: set[Process] = set()
    try:
        text = wait_for(
            lambda: "Press Ctrl-C" in output.read_text() and output.read_text(),
            timeout=90,
            what="run_all to print its banner",
        )
        server = postmaster_pid(own_data_dir)
        assert server is not None, f"no embedded PostgreSQL in {own_data_dir}: {text[-3000:]}"
        started |= process_tree(process.pid)
        server_tree |= process_tree(server)
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
        # Again just before Ctrl-C: django-q2 may have started workers since.
        started |= process_tree(process.pid)
        server_tree |= process_tree(server)
        commands = [command_line(pid) for pid, _ in started | server_tree]
        for part, count in [
            ("queueapp.upstream.simulator", 1),
            ("daphne", 1),
            ("manage.py qcluster", 2),
            (str(own_data_dir), 1),  # the postmaster
        ]:
            found = sum(part in line for line in commands)
            assert found >= count, f"{part!r} in {found} of run_all's processes: {commands}"
    finally:
        process.send_signal(signal.SIGINT)  # what Ctrl-C delivers
        try:
            process.wait(timeout=RUN_ALL_STOP_SECONDS)
        finally:
            deadline = time.monotonic() + LEFTOVER_DEADLINE_SECONDS
            everything = started | server_tree
            while (left := alive(everything)) and time.monotonic() < deadline:
                time.sleep(0.1)  # until every process is gone or the deadline passes
            described = {pid: command_line(pid) for pid in left}
            # Not to outlive the test, whatever it asserts (the fixture stops
            # a server left running).
            for pid in alive(started):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
    log = output.read_text()[-3000:]
    assert process.returncode == 0, log
    assert not described, (
        f"{len(described)} of the {len(everything)} processes run_all started still run "
        f"{LEFTOVER_DEADLINE_SECONDS} s after it stopped on Ctrl-C: {described}\n{log}"
    )
    assert postmaster_pid(own_data_dir) is None, "the embedded PostgreSQL still runs"
