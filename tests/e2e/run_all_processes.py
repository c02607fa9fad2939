"""The processes `make run` starts, seen from outside as a user would: its
command started as on a fresh machine, its banner, the process table, and
the simulator's and the jobs' state; shared by the run_all tests."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import httpx

from gpusched.stack import ROOT, wait_for

# run_all gives its dispatchers GPUSCHED_STOP_SECONDS (set to this) to finish
# their jobs, then its simulators 15 s, before it kills them; the rest of a
# process tree (orphans reparented to init) must be gone soon after.
STOP_GRACE_SECONDS = 20
RUN_ALL_STOP_SECONDS = 60
# A second Ctrl-C stops run_all at once: this soon, with the database.
AT_ONCE_SECONDS = 10
LEFTOVER_DEADLINE_SECONDS = 10
# run_all SIGKILLed: what it started is gone this soon after (gpusched/watchdog.py).
KILLED_DEADLINE_SECONDS = 5

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


def listening(port: int) -> bool:
    """Whether some socket listens on this TCP port, from /proc/net/tcp{,6}."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as rows:
            next(rows)  # the header
            for row in rows:
                local, _, state = row.split()[1:4]
                if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:  # LISTEN
                    return True
    return False


def start_run_all(data_dir: Path, port: int, simulator_port: int, output: Path, **env: str):
    """`make run` as on a fresh machine: DATABASE_URL and LLAMA_SWAP_URL unset, so
    the embedded PostgreSQL (in `data_dir`) and the built-in simulator. The
    demo token's file is the test's own, beside `output`."""
    env = dict(
        os.environ,
        GPUSCHED_PGDATA=str(data_dir),
        PORT=str(port),
        SIMULATOR_PORT=str(simulator_port),
        PYTHONUNBUFFERED="1",
        GPUSCHED_DEMO_TOKEN_FILE=str(output.parent / "demo-token"),
        GPUSCHED_STOP_SECONDS=str(STOP_GRACE_SECONDS),
        **env,
    )
    env.pop("DATABASE_URL", None)
    env.pop("LLAMA_SWAP_URL", None)
    with output.open("ab") as sink:
        return subprocess.Popen(
            [sys.executable, "manage.py", "run_all"],
            cwd=ROOT,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def banner(output: Path, run_all: subprocess.Popen) -> str:
    """run_all's output once it printed its banner (it then answers on its port).
    Should run_all stop first, the failure shows why, from its output."""

    def printed() -> str | None:
        text = output.read_text()
        if "Press Ctrl-C" in text:
            return text
        if run_all.poll() is not None:
            raise AssertionError(
                f"run_all exited ({run_all.returncode}) before its banner:\n{text}"
            )
        return None

    try:
        return wait_for(printed, timeout=90, message="run_all to print its banner")
    except TimeoutError as exc:
        raise AssertionError(f"{exc}; its output:\n{output.read_text()[-3000:]}") from None


def server_tree(data_dir: Path) -> set[Process]:
    server = postmaster_pid(data_dir)
    assert server is not None, f"no embedded PostgreSQL in {data_dir}"
    return process_tree(server)


def demo_token(text: str) -> str:
    found = re.search(r"demo member token:\s+(\S+)", text)
    assert found, f"no demo token in run_all's banner:\n{text[-3000:]}"
    return found.group(1)


def in_flight(simulator_port: int, label: str) -> dict | None:
    """The simulator's log entry of the request labelled `label` once it is
    admitted (its load and run seconds known) and not yet answered."""
    log = httpx.get(f"http://127.0.0.1:{simulator_port}/sim/log", timeout=10).json()
    for entry in log:
        body = entry["body"]
        if isinstance(body, dict) and body.get("user") == label:
            admitted = entry["run_seconds"] is not None and entry["finished_at"] is None
            return entry if admitted else None
    return None


def submit_chat(base: str, token: str, label: str, seconds: float | None = None) -> str:
    """A chat job labelled `label` (the body's `user`); its URL."""
    body = {"model": "chat-small", "messages": [{"role": "user", "content": "hi"}], "user": label}
    if seconds is not None:
        body["sim"] = {"seconds": seconds}
    created = httpx.post(
        f"{base}/api/jobs/",
        json={"path": "/v1/chat/completions", "body": body},
        headers={"Authorization": f"Bearer {token}"},
    )
    assert created.status_code == 201, created.text
    return f"{base}/api/jobs/{created.json()['id']}/"


def assert_all_gone(processes: set[Process], output: Path) -> None:
    """Every one of `processes` ends within LEFTOVER_DEADLINE_SECONDS."""
    deadline = time.monotonic() + LEFTOVER_DEADLINE_SECONDS
    while (left := alive(processes)) and time.monotonic() < deadline:
        time.sleep(0.1)  # until every process is gone or the deadline passes
    described = {pid: command_line(pid) for pid in left}
    assert not described, (
        f"{len(described)} of the {len(processes)} processes still run "
        f"{LEFTOVER_DEADLINE_SECONDS} s after run_all stopped: {described}\n"
        + output.read_text()[-3000:]
    )
