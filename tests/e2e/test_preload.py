"""Preloads as real processes: the dispatcher loads a model through the
simulator's /upstream/<model>/ (llama-swap's own load), a job whose model is
loaded goes ahead of a background preload, and a preload of the resident
model ends without a call. What ran is read from the simulator's own log."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpusched.stack import wait_for
from queueapp import services
from queueapp.models import Job, JobStatus, RunStats
from queueapp.upstream.client import preload_path
from tests import factories
from tests.e2e.helpers import e2e_simulator, ended

pytestmark = [pytest.mark.e2e]
GPUSCHED = str(Path(sys.executable).with_name("gpusched"))


def resident(sim) -> str | None:
    running = sim.running()["running"]
    return running[0]["model"] if running and running[0]["state"] == "ready" else None


def test_gpusched_preload_makes_the_model_resident(world):
    world.start_cluster()
    web = world.start_web()
    _, token = factories.member("ann", "pro")
    done = subprocess.run(
        [GPUSCHED, "preload", "chat-b", "--wait", "--json"],
        capture_output=True,
        text=True,
        env=dict(os.environ, GPUSCHED_URL=web.url, GPUSCHED_TOKEN=token),
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    job = json.loads(done.stdout)
    assert (job["status"], job["priority"], job["path"]) == (
        "succeeded",
        -100,
        preload_path("chat-b"),
    )
    assert job["result"]["body"]["already_resident"] is False
    assert resident(world.simulator) == "chat-b"
    (load,) = world.simulator.log()
    assert (load["path"], load["swapped"], load["run_seconds"]) == ("/upstream/chat-b/", True, 0.0)
    # The load measured chat-b's swap, which the estimates read.
    learned = RunStats.objects.get(path=preload_path("chat-b"))
    assert (learned.cold_samples, learned.warm_samples) == (1, 0)


def chat_a_warm(world, member) -> None:
    """chat-a resident after one job of `member`'s, every job ended, the
    simulator's log emptied."""
    factories.job(member, model="chat-a", label="warm")
    wait_for(lambda: resident(world.simulator) == "chat-a", message="chat-a resident")
    wait_for(lambda: not Job.objects.exclude(status=JobStatus.SUCCEEDED).exists())
    world.reset_log()


def test_a_job_for_the_resident_model_goes_ahead_of_a_preload_of_another(world):
    world.start_cluster()
    ann, _ = factories.member("ann", "pro")
    chat_a_warm(world, ann)
    factories.policy(dispatch_paused=True)
    preload = services.job_preload(member=ann, model="chat-b", priority_header=None)
    interactive = factories.job(ann, priority="interactive", model="chat-a", label="asked")
    factories.policy(dispatch_paused=False)
    ended(preload.pk)
    assert ended(interactive.pk).status == JobStatus.SUCCEEDED
    assert [(e["path"], e["model"]) for e in world.simulator.log()] == [
        ("/v1/chat/completions", "chat-a"),
        ("/upstream/chat-b/", "chat-b"),
    ]
    assert resident(world.simulator) == "chat-b"


def test_a_preload_of_the_resident_model_ends_without_a_call(world):
    world.start_cluster()
    ann, _ = factories.member("ann", "pro")
    chat_a_warm(world, ann)
    preload = ended(services.job_preload(member=ann, model="chat-a", priority_header=None).pk)
    assert preload.status == JobStatus.SUCCEEDED
    assert preload.result_body == {
        "model": "chat-a",
        "loaded": True,
        "already_resident": True,
        "upstream_status": None,
    }
    assert world.simulator.log() == []
    assert not RunStats.objects.filter(path=preload_path("chat-a")).exists()  # nothing measured


def test_a_preload_pinned_to_a_gpu_waits_for_that_gpu_alone(world):
    second = e2e_simulator()
    try:
        upstreams = f"gpu0={world.simulator.url},gpu1={second.url}"
        services.gpu_register(name="gpu1", url=second.url)
        world.start_cluster(upstream_url=upstreams, GPUSCHED_GPU="gpu0")
        ann, _ = factories.member("ann", "pro")
        preload = services.job_preload(
            member=ann, model="chat-b", priority_header="interactive", gpu="gpu1"
        )
        # gpu0 claims, and passes the preload over for a later, lower job.
        after = factories.job(ann, model="chat-a", label="after")
        assert ended(after.pk).gpu.name == "gpu0"
        assert Job.objects.get(pk=preload.pk).status == JobStatus.QUEUED
        world.start_cluster(upstream_url=upstreams, GPUSCHED_GPU="gpu1")
        done = ended(preload.pk)
        assert (done.status, done.gpu.name) == (JobStatus.SUCCEEDED, "gpu1")
        assert [e["path"] for e in second.log()] == ["/upstream/chat-b/"]
        assert [e["path"] for e in world.simulator.log()] == ["/v1/chat/completions"]
        assert resident(second) == "chat-b"
    finally:
        second.stop()
