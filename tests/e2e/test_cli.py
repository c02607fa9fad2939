"""The `gpusched` command as a subprocess against the running system."""

import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from gpusched.stack import ROOT, wait_for
from queueapp.models import Job, JobStatus, Member
from tests import factories

pytestmark = [pytest.mark.e2e]
GPUSCHED = str(Path(sys.executable).with_name("gpusched"))
DURATION = r"(\d+ h \d\d m|\d+ m \d\d s|\d+ s)"  # as gpusched_client.text writes them


def cli(web, token, *args, stdin=None, check=True):
    done = subprocess.run(
        [GPUSCHED, *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=cli_env(web, token),
        cwd=ROOT,
        timeout=120,
    )
    if check:
        assert done.returncode == 0, done.stdout + done.stderr
    return done


def cli_env(web, token):
    # Wide enough that rich never wraps a table cell the tests read.
    return dict(os.environ, GPUSCHED_URL=web.url, GPUSCHED_TOKEN=token, COLUMNS="200")


def test_submit_watch_why_queue_and_cancel(world, tmp_path):
    world.start_cluster()
    web = world.start_web()
    _, token = factories.member("ann-member", "pro")
    other, _ = factories.member("bob-member", "free")
    factories.policy(dispatch_paused=True)
    ahead = factories.job(other, priority="interactive", model="chat-a", seconds=0.1)
    body_file = tmp_path / "body.json"
    body_file.write_text(json.dumps(factories.chat_body("chat-a", 1.0)))
    args = ["submit", "/v1/chat/completions", "--body", str(body_file), "--priority", "42"]
    submitted = json.loads(cli(web, token, *args, "--json").stdout)
    assert (submitted["model"], submitted["priority_requested"]) == ("chat-a", 42)
    job_id = submitted["id"]

    # `watch` to a file (not a terminal): one plain line per change.
    watched = tmp_path / "watch.txt"
    with watched.open("w") as sink:
        watcher = subprocess.Popen(
            [GPUSCHED, "watch", str(job_id)], env=cli_env(web, token), stdout=sink, cwd=ROOT
        )
    wait_for(lambda: "position 2" in watched.read_text(), message="watch's queued line")
    factories.policy(dispatch_paused=False)
    assert watcher.wait(timeout=60) == 0
    lines = watched.read_text().splitlines()
    head = re.escape(f"job {job_id} · chat-a · band +42")
    # Nothing of chat-a is learned yet: the start behind its job is a guess.
    assert re.fullmatch(
        rf"{head} · queued · position 2 · starts in ~{DURATION} \(a guess\) · waiting {DURATION}",
        lines[0],
    )
    assert any(re.fullmatch(rf"{head} · running {DURATION}", line) for line in lines[1:-1]), lines
    assert re.fullmatch(rf"{head} · succeeded in {DURATION}", lines[-1])
    assert "\x1b[" not in watched.read_text()

    why = cli(web, token, "why", str(job_id)).stdout
    assert why.startswith("Waited ")
    rows = [line for line in why.splitlines() if "│" in line or "┃" in line]
    assert re.search(r"part\s+┃\s+seconds\s+┃\s+job ahead\s+┃\s+decided by", rows[0])
    cells = {
        tuple(cell.strip() for cell in row.strip("│ ").split("│")) for row in rows[1:] if "│" in row
    }
    ahead_row = next(cell for cell in cells if cell[0] == "dispatched ahead")
    assert ahead_row[2] == f"#{ahead.pk} chat-a band +100" and ahead_row[3] == "a higher band"
    assert re.fullmatch(r"\d+\.\d", ahead_row[1])
    assert any(cell[0] == "gpu idle" for cell in cells)  # dispatch was paused

    factories.policy(dispatch_paused=True)
    body = json.dumps(factories.chat_body("chat-a", 0.1))
    queued = json.loads(
        cli(web, token, "submit", "/v1/chat/completions", "--json", stdin=body).stdout
    )
    table = cli(web, token, "queue").stdout
    assert f"#{queued['id']}" in table and "1 queued" in table
    cancelled = cli(web, token, "cancel", str(queued["id"]))
    assert "cancelled" in cancelled.stdout
    refused = cli(web, token, "cancel", str(job_id), check=False)
    assert refused.returncode == 2 and "never interrupted" in refused.stderr


def chain_args(path, out, *extra):
    return ["chain", "run", str(path), "--path", "/v1/completions", "--out", str(out), *extra]


def units_file(tmp_path, count, seconds):
    path = tmp_path / "film.jsonl"
    path.write_text(
        "\n".join(
            json.dumps({"model": "chat-a", "prompt": f"shot {i}", "sim": {"seconds": seconds}})
            for i in range(count)
        )
    )
    return path


def test_chain_runs_one_unit_at_a_time_and_lets_interactive_work_in(world, tmp_path):
    world.start_cluster()
    web = world.start_web()
    member, token = factories.member("ann-member", "pro")
    other, _ = factories.member("bob-member", "free")
    path = units_file(tmp_path, 10, 0.3)
    most_at_once = []
    stop = threading.Event()

    def sample():
        from django.db import connection

        while not stop.is_set():
            most_at_once.append(
                Job.objects.filter(chain_id="film", status__in=["queued", "running"]).count()
            )
            stop.wait(0.02)
        connection.close()

    sampler = threading.Thread(target=sample)
    sampler.start()
    env = dict(os.environ, GPUSCHED_URL=web.url, GPUSCHED_TOKEN=token)
    args = [GPUSCHED, *chain_args(path, tmp_path / "out")]
    producer = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL)
    try:
        wait_for(
            lambda: len(list((tmp_path / "out").glob("unit-*.json"))) >= 2, message="two units"
        )
        urgent = factories.job(other, priority="interactive", model="chat-a", label="urgent")
        assert producer.wait(timeout=60) == 0
    finally:
        stop.set()
        sampler.join()
    assert max(most_at_once) == 1
    assert len(list((tmp_path / "out").glob("unit-*.json"))) == 10
    # The interactive job did not wait behind the chain: at most one unit
    # started between its submission and its start (a unit whose submission
    # committed just before it did; `submitted_at` is its transaction's start).
    urgent = Job.objects.get(pk=urgent.pk)
    assert urgent.status == JobStatus.SUCCEEDED
    later_units = Job.objects.filter(chain_id="film", submitted_at__gt=urgent.submitted_at)
    assert later_units.exists()
    overtaking = later_units.filter(started_at__lt=urgent.started_at)
    assert overtaking.count() <= 1, list(overtaking.values("id", "submitted_at", "started_at"))


def test_chain_resumes_after_being_killed_without_repeating_finished_units(world, tmp_path):
    world.start_cluster()
    web = world.start_web()
    _, token = factories.member("ann-member", "pro")
    path = units_file(tmp_path, 6, 0.3)
    env = dict(os.environ, GPUSCHED_URL=web.url, GPUSCHED_TOKEN=token)
    out = tmp_path / "out"
    args = [GPUSCHED, *chain_args(path, out)]
    first = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL)
    wait_for(lambda: len(list(out.glob("unit-*.json"))) >= 3, message="three units done")
    first.send_signal(signal.SIGKILL)
    first.wait()
    finished = {p.name for p in out.glob("unit-*.json")}
    second = subprocess.run(args, env=env, capture_output=True, text=True, timeout=60)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "done: 6/6" in second.stdout
    # Not a terminal: plain progress lines, no bar and no escape codes.
    assert re.search(rf"^6/6 · {DURATION} elapsed · ~0 s left$", second.stdout, re.MULTILINE)
    assert "\x1b" not in second.stdout + second.stderr
    assert len(list(out.glob("unit-*.json"))) == 6
    prompts = [entry["body"]["prompt"] for entry in world.served()]
    assert sorted(prompts) == sorted(set(prompts))  # no unit ran twice
    assert finished  # the kill came after some units had finished


def test_ctrl_c_leaves_no_unit_queued(world, tmp_path):
    world.start_web()
    _, token = factories.member("ann-member", "pro")
    factories.policy(dispatch_paused=True)
    path = units_file(tmp_path, 3, 0.1)
    env = dict(os.environ, GPUSCHED_URL=world.servers[0].url, GPUSCHED_TOKEN=token)
    args = [GPUSCHED, "chain", "run", str(path), "--out", str(tmp_path / "out")]
    producer = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, text=True)
    unit = wait_for(lambda: Job.objects.filter(chain_id="film").first(), message="the first unit")
    producer.send_signal(signal.SIGINT)
    output, _ = producer.communicate(timeout=30)

    assert producer.returncode == 130
    assert "run again to resume" in output
    assert Job.objects.get(pk=unit.pk).status == JobStatus.CANCELLED
    assert not Job.objects.filter(status=JobStatus.QUEUED).exists()


def test_a_failing_unit_is_retried_then_the_chain_stops_with_the_reason(world, tmp_path):
    world.start_cluster()
    web = world.start_web()
    _, token = factories.member("ann-member", "pro")
    path = tmp_path / "film.jsonl"
    path.write_text(json.dumps({"model": "chat-a", "prompt": "bad", "sim": {"status": 500}}))
    done = cli(web, token, *chain_args(path, tmp_path / "out", "--retries", "1"), check=False)
    assert done.returncode == 1
    assert "stopped: unit 0 failed 2 times: llama-swap answered 500" in done.stdout
    assert "\x1b" not in done.stdout + done.stderr
    assert len(world.simulator.log()) == 2


def test_submit_builds_the_body_waits_for_the_result_and_gpus_models_and_queue_show_the_gpus(
    world,
):
    world.start_cluster()
    web = world.start_web()
    _, token = factories.member("ann-member", "pro")
    done = cli(web, token, "submit", "--model", "chat-small", "--prompt", "hi", "--wait")
    first, answer = done.stdout.splitlines()[:2]
    job = Job.objects.get(model="chat-small")
    assert re.fullmatch(rf"job {job.pk} · chat-small · band \+0 · succeeded in {DURATION}", first)
    assert job.path == "/v1/chat/completions"
    assert job.body == {"model": "chat-small", "messages": [{"role": "user", "content": "hi"}]}
    assert answer == job.result_body["choices"][0]["message"]["content"] and answer

    gpus = cli(web, token, "gpus").stdout
    row = next(line for line in gpus.splitlines() if "gpu0" in line)
    assert re.search(r"gpu0\s+│\s+healthy\s+│\s+chat-small\s+│\s+idle\s+│", row), gpus
    models = cli(web, token, "models").stdout
    assert re.search(r"chat-a\s+│\s+1\s+│\s+(default|server)\s+│\s+gpu0", models), models

    held = factories.job(Member.objects.get(name="ann-member"), model="chat-a", seconds=5)
    wait_for(lambda: Job.objects.get(pk=held.pk).status == JobStatus.RUNNING, message="held")
    queue = cli(web, token, "queue").stdout
    assert re.search(
        rf"^gpu0: running #{held.pk} chat-a band \+0 · ann-member · {DURATION}$",
        queue,
        re.MULTILINE,
    ), queue
    assert f"#{held.pk}" in cli(web, token, "gpus").stdout
