"""`make run` as a user runs it: one command, a job over real HTTP, Ctrl-C stops all.

It runs as on a fresh machine: DATABASE_URL unset, so run_all starts the
embedded PostgreSQL, here in a data folder of the test's own (GPUSCHED_PGDATA)
that nothing else uses, and Ctrl-C must stop that server too.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import stat
import subprocess
import sys
import threading
import time
from datetime import datetime

import httpx
import pytest

from gpusched.stack import ROOT, free_consecutive_ports, free_port, wait_for
from tests.e2e.run_all_processes import (
    AT_ONCE_SECONDS,
    KILLED_DEADLINE_SECONDS,
    LEFTOVER_DEADLINE_SECONDS,
    RUN_ALL_STOP_SECONDS,
    Process,
    alive,
    assert_all_gone,
    banner,
    command_line,
    demo_token,
    in_flight,
    listening,
    postmaster_pid,
    process_table,
    process_tree,
    server_tree,
    start_run_all,
    submit_chat,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_run_all_serves_a_job_end_to_end_and_ctrl_c_stops_every_process(own_data_dir, tmp_path):
    """With two simulated GPUs: a simulator and a dispatcher cluster each."""
    simulator_port, port = free_consecutive_ports(2), free_port()
    output = tmp_path / "run_all.log"
    process = start_run_all(own_data_dir, port, simulator_port, output, SIMULATED_GPUS="2")
    started = process_tree(process.pid)  # run_all's tree, then the server's
    server_tree: set[Process] = set()
    try:
        text = banner(output, process)
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
            message=f"the job to come back from the simulator (run_all's output: {output})",
        )
        assert job["result"]["body"]["model"] == "chat-small"
        gpus = httpx.get(f"{base}/api/gpus/", headers=headers).json()
        assert [(gpu["name"], gpu["url"]) for gpu in gpus] == [
            ("gpu0", f"http://127.0.0.1:{simulator_port}"),
            ("gpu1", f"http://127.0.0.1:{simulator_port + 1}"),
        ]
        assert job["gpu"] in ("gpu0", "gpu1")
        assert httpx.get(f"{base}/admin/login/").status_code == 200
        # Again just before Ctrl-C: django-q2 may have started workers since.
        started |= process_tree(process.pid)
        server_tree |= process_tree(server)
        commands = [command_line(pid) for pid, _ in started | server_tree]
        for part, count in [
            ("queueapp.upstream.simulator", 2),
            ("gpusched.serve", 1),
            ("manage.py qcluster", 3),  # a dispatcher per GPU, and the webhooks
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


def clusters_have_their_workers(run_all: int) -> bool:
    """Both django-q2 clusters run_all started have forked their processes
    (the sentinel and its workers below each cluster's main process)."""
    clusters = [
        pid
        for pid, (parent, _, _) in process_table().items()
        if parent == run_all and "manage.py qcluster" in command_line(pid)
    ]
    return len(clusters) == 2 and all(len(process_tree(pid)) >= 3 for pid in clusters)


def health(base: str) -> dict | None:
    try:
        answer = httpx.get(f"{base}/api/health/", timeout=2)
    except httpx.TransportError:
        return None
    return answer.json() if answer.status_code == 200 else None


def test_run_all_killed_by_sigkill_takes_every_process_it_started_with_it(
    own_data_dir, tmp_path, receivers
):
    """The web server, both clusters with their workers (one busy) and the
    simulator die with run_all within seconds and free their ports, so the next
    `make run` comes up on the same port."""
    port, simulator_port = free_port(), free_port()
    base = f"http://127.0.0.1:{port}"
    first_output, second_output = tmp_path / "first.log", tmp_path / "second.log"
    receiver = receivers(hang=True)
    # The receiver is on this host: exempt from the webhook SSRF guard.
    allowed = {"WEBHOOK_ALLOWED_NETWORKS": "127.0.0.0/8"}
    first = start_run_all(own_data_dir, port, simulator_port, first_output, **allowed)
    second: subprocess.Popen | None = None
    started = process_tree(first.pid)
    try:
        text = banner(first_output, first)
        # A webhook delivery in flight when run_all dies: a worker that its
        # cluster, stopping on its own, would wait for (up to the delivery's
        # timeout), where the watchdog's signal to the group ends it at once.
        token = re.search(r"demo member token:\s+(\S+)", text).group(1)
        body = {"model": "chat-small", "messages": [{"role": "user", "content": "hello"}]}
        created = httpx.post(
            f"{base}/api/jobs/",
            json={"path": "/v1/chat/completions", "body": body, "callback_url": receiver.url},
            headers={"Authorization": f"Bearer {token}"},
        )
        assert created.status_code == 201, created.text + first_output.read_text()[-3000:]
        wait_for(lambda: receiver.requests, message="the webhook delivery to reach the receiver")
        wait_for(
            lambda: clusters_have_their_workers(first.pid),
            message="both clusters to fork their workers",
        )
        started |= process_tree(first.pid)
        server = postmaster_pid(own_data_dir)
        commands = [command_line(pid) for pid, _ in started]
        for part, count in [
            ("gpusched.watchdog", 1),
            ("queueapp.upstream.simulator", 1),
            ("gpusched.serve", 1),
            ("manage.py qcluster", 6),  # two clusters, each main, sentinel, worker(s)
        ]:
            found = sum(part in line for line in commands)
            assert found >= count, f"{part!r} in {found} of run_all's processes: {commands}"

        first.kill()  # SIGKILL, to run_all alone: its children have sessions of their own
        first.wait(timeout=10)
        deadline = time.monotonic() + KILLED_DEADLINE_SECONDS
        while (
            (left := alive(started)) or listening(port) or listening(simulator_port)
        ) and time.monotonic() < deadline:
            time.sleep(0.05)  # until everything is gone or the deadline passes
        described = {pid: command_line(pid) for pid in left}
        assert not described, (
            f"{len(described)} of the {len(started)} processes run_all started still run "
            f"{KILLED_DEADLINE_SECONDS} s after it was SIGKILLed: {described}\n"
            + first_output.read_text()[-3000:]
        )
        assert not listening(port) and not listening(simulator_port)
        # The embedded PostgreSQL is no child of run_all: it outlives a crash
        # (as any process attached to it), and the next run attaches to it.
        assert postmaster_pid(own_data_dir) == server

        second = start_run_all(own_data_dir, port, simulator_port, second_output)
        answer = wait_for(
            lambda: health(base),
            timeout=90,
            message=f"a new run_all to answer on port {port} (its output: {second_output})",
        )
        assert answer["database"] == "ok"
        started |= process_tree(second.pid)
    finally:
        if second is not None:
            second.send_signal(signal.SIGINT)  # what Ctrl-C delivers
            with contextlib.suppress(subprocess.TimeoutExpired):
                second.wait(timeout=RUN_ALL_STOP_SECONDS)
            if second.poll() is None:
                second.kill()
        # Not to outlive the test, whatever it asserts.
        for pid in alive(started):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert second.returncode == 0, second_output.read_text()[-3000:]


def test_run_all_restarted_keeps_the_demo_token_and_a_ctrl_c_fails_no_job(own_data_dir, tmp_path):
    """Ctrl-C while a job runs on the simulator, with a backlog: the stop comes
    before that job's end, which would claim the next job in the same commit.
    The job finishes against a simulator still up, the backlog waits unsent
    for the next start, nothing fails and nothing is left running. The next
    start prints the same token, which still answers; there a second Ctrl-C
    stops at once, a long job in flight."""
    port, simulator_port = free_port(), free_port()
    first_output, second_output = tmp_path / "first.log", tmp_path / "second.log"
    token_file = tmp_path / "demo-token"
    base = f"http://127.0.0.1:{port}"
    first = start_run_all(own_data_dir, port, simulator_port, first_output)
    second: subprocess.Popen | None = None
    started = process_tree(first.pid)
    try:
        token = demo_token(banner(first_output, first))
        assert token_file.read_text().strip() == token
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        # The first loads chat-small (a swap) and runs 3 s: long enough to be
        # caught in flight, and a backlog behind it.
        jobs = {"running": submit_chat(base, token, "running-long", seconds=3)}
        jobs.update({label: submit_chat(base, token, label) for label in ("next-0", "next-1")})
        sent = wait_for(
            lambda: in_flight(simulator_port, "running-long"),
            timeout=60,
            message="the first job to reach the simulator",
        )
        started |= process_tree(first.pid) | server_tree(own_data_dir)
        first.send_signal(signal.SIGINT)  # what Ctrl-C delivers
        first.wait(timeout=RUN_ALL_STOP_SECONDS)
        assert first.returncode == 0, first_output.read_text()[-3000:]
        assert "killing" not in first_output.read_text()
        assert_all_gone(started, first_output)
        assert postmaster_pid(own_data_dir) is None, "the embedded PostgreSQL still runs"

        second = start_run_all(own_data_dir, port, simulator_port, second_output)
        started |= process_tree(second.pid)
        assert demo_token(banner(second_output, second)) == token
        restarted = {
            label: wait_for(
                lambda url=url: (
                    (job := httpx.get(url, headers={"Authorization": f"Bearer {token}"}))
                    .json()
                    .get("status")
                    in ("succeeded", "failed")
                    and job.json()
                ),
                timeout=60,
                message=f"job {label} to end",
            )
            for label, url in jobs.items()
        }
        for label, job in restarted.items():
            assert (job["status"], job["error"], job["attempts"]) == ("succeeded", None, 1), label
        # The one in flight ended in the first run after its full load and
        # run (a stopping simulator cuts them short), and the backlog ran
        # only in the second.
        running = restarted["running"]
        ran = datetime.fromisoformat(running["finished_at"]) - datetime.fromisoformat(
            running["started_at"]
        )
        assert ran.total_seconds() >= sent["load_seconds"] + sent["run_seconds"], (running, sent)
        assert running["finished_at"] < restarted["next-0"]["started_at"]
        assert "running-long" not in [
            entry["body"].get("user")
            for entry in httpx.get(f"http://127.0.0.1:{simulator_port}/sim/log").json()
        ]

        submit_chat(base, token, "long", seconds=600)
        wait_for(lambda: in_flight(simulator_port, "long"), message="the long job in flight")
        started |= process_tree(second.pid) | server_tree(own_data_dir)
        second.send_signal(signal.SIGINT)
        wait_for(lambda: "stopping:" in second_output.read_text(), message="the stop to begin")
        second.send_signal(signal.SIGINT)  # the second Ctrl-C
        second.wait(timeout=AT_ONCE_SECONDS)
        assert second.returncode == 0, second_output.read_text()[-3000:]
        assert "stopping at once; killing it" in second_output.read_text()
        assert_all_gone(started, second_output)
        assert postmaster_pid(own_data_dir) is None, "the embedded PostgreSQL still runs"
    finally:
        for process in (first, second):
            if process is not None and process.poll() is None:
                process.kill()
        # Not to outlive the test, whatever it asserts.
        for pid in alive(started):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_a_ctrl_c_lets_a_front_door_call_in_flight_end_with_its_answer(own_data_dir, tmp_path):
    """The web server relays a front-door call's job itself: the stop waits
    for it before stopping the web server, so its caller gets llama-swap's
    answer and the job succeeds."""
    port, simulator_port = free_port(), free_port()
    output = tmp_path / "run.log"
    base = f"http://127.0.0.1:{port}"
    run_all = start_run_all(own_data_dir, port, simulator_port, output)
    started = process_tree(run_all.pid)
    answers: list[httpx.Response | httpx.HTTPError] = []

    def call_in_flight(url: str, body: dict, token: str) -> None:
        try:
            answers.append(
                httpx.post(url, json=body, headers={"Authorization": f"Bearer {token}"}, timeout=60)
            )
        except httpx.HTTPError as exc:  # cut off by the stop: the failure this test catches
            answers.append(exc)

    try:
        token = demo_token(banner(output, run_all))
        body = {
            "model": "chat-small",
            "messages": [{"role": "user", "content": "hi"}],
            "user": "in-flight",
            "sim": {"seconds": 3},
        }
        call = threading.Thread(
            target=call_in_flight, args=(f"{base}/v1/chat/completions", body, token)
        )
        call.start()
        wait_for(
            lambda: in_flight(simulator_port, "in-flight"),
            timeout=60,
            message="the front-door call to reach the simulator",
        )
        started |= process_tree(run_all.pid) | server_tree(own_data_dir)
        run_all.send_signal(signal.SIGINT)  # what Ctrl-C delivers
        call.join(timeout=RUN_ALL_STOP_SECONDS)
        run_all.wait(timeout=RUN_ALL_STOP_SECONDS)
        assert run_all.returncode == 0, output.read_text()[-3000:]
        assert "killing" not in output.read_text()
        (answer,) = answers
        assert isinstance(answer, httpx.Response), f"the call was cut off: {answer!r}"
        assert answer.status_code == 200, answer.text
        assert answer.json()["object"] == "chat.completion"
        assert_all_gone(started, output)
    finally:
        if run_all.poll() is None:
            run_all.kill()
        for pid in alive(started):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


# An owner of a watchdog, as run_all is: one process group of two sleeps
# guarded, then told to release it or not, then blocked on its standard input
# (which the test holds open) until the test kills it.
WATCHDOG_OWNER = """
import subprocess, sys
from gpusched.watchdog import Watchdog
watchdog = Watchdog.start()
group = subprocess.Popen(["sh", "-c", "sleep 60 & exec sleep 60"], start_new_session=True)
watchdog.guard(group.pid)
if sys.argv[1] == "release":
    watchdog.release()
print(watchdog.process.pid, group.pid, flush=True)
sys.stdin.read()
"""


@pytest.mark.parametrize("released", [False, True], ids=["owner-killed", "owner-released"])
def test_the_watchdog_stops_what_it_guards_when_its_owner_dies_without_releasing_it(released):
    owner = subprocess.Popen(
        [sys.executable, "-c", WATCHDOG_OWNER, "release" if released else "keep"],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    guarded: set[Process] = set()
    try:
        watchdog_pid, group = (int(pid) for pid in owner.stdout.readline().split())
        guarded = wait_for(
            lambda: len(tree := process_tree(group)) == 2 and tree, message="both sleeps to start"
        )
        watchdog = process_tree(watchdog_pid)
        owner.kill()
        owner.wait(timeout=10)
        if released:
            # The owner's clean stop went through: the watchdog ended then,
            # before the owner died, and signalled nothing.
            assert not alive(watchdog)
            assert len(alive(guarded)) == 2
        else:
            wait_for(
                lambda: not alive(guarded | watchdog),
                timeout=KILLED_DEADLINE_SECONDS,
                message="the watchdog to stop the group it guards, then end",
            )
    finally:
        owner.kill()
        owner.stdout.close()
        for pid in alive(guarded):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
