"""Several GPUs on one queue, as real processes: two llama-swap simulators
with their own model lists, a dispatcher cluster per GPU, one PostgreSQL.
Every assertion about where and when a job ran is read from the simulators'
own logs."""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from gpusched.stack import wait_for
from queueapp import services
from queueapp.models import Gpu, Job, JobStatus, Tier
from queueapp.upstream.simulator import LlamaSwapSimulator
from queueapp.why import job_why
from tests import factories
from tests.e2e.helpers import REDIS_URL, Watcher, redis_available

pytestmark = [pytest.mark.e2e, pytest.mark.database_server]


class TwoGpus:
    def __init__(self, world, gpu0: LlamaSwapSimulator, gpu1: LlamaSwapSimulator) -> None:
        self.world = world
        self.sims = {"gpu0": gpu0, "gpu1": gpu1}
        self.upstreams = f"gpu0={gpu0.url},gpu1={gpu1.url}"
        self.clusters: dict[str, object] = {}

    def start(self, name: str):
        """GPU `name`'s dispatcher cluster, once its pass listens for work."""
        cluster = self.world.start_cluster(
            upstream_url=self.upstreams, GPUSCHED_GPU=name, GPUSCHED_DISPATCH_BUDGET="20"
        )
        self.clusters[name] = cluster
        return cluster

    def ran_on(self, name: str) -> list[str]:
        """Labels of the jobs GPU `name`'s simulator answered, in order."""
        return [e["body"]["user"] for e in self.sims[name].log() if e["status"] == 200]


def simulator(models: dict[str, float]) -> LlamaSwapSimulator:
    return LlamaSwapSimulator(models=models, swap_seconds=0.05).start()


@pytest.fixture
def make_gpus(world) -> Iterator:
    started: list[LlamaSwapSimulator] = []

    def make(models0: dict[str, float], models1: dict[str, float]) -> TwoGpus:
        sims = simulator(models0), simulator(models1)
        started.extend(sims)
        return TwoGpus(world, *sims)

    yield make
    for sim in started:
        sim.stop()


def all_succeeded(jobs: list[Job]) -> bool:
    return Job.objects.filter(pk__in=[j.pk for j in jobs], status=JobStatus.SUCCEEDED).count() == (
        len(jobs)
    )


def test_a_model_runs_only_where_served_and_a_shared_one_on_both_at_once(world, make_gpus):
    gpus = make_gpus({"shared": 1.0, "only0": 0.05}, {"shared": 1.0, "only1": 0.05})
    gpus.start("gpu0")
    gpus.start("gpu1")
    ann, _ = factories.member("ann", "pro")
    bob, _ = factories.member("bob", "pro")
    wait_for(
        lambda: Gpu.objects.filter(served_models__contains=["shared"]).count() == 2,
        message="both dispatchers to read their GPU's models",
    )
    jobs = [
        factories.job(ann, model="shared", label="shared-ann"),
        factories.job(bob, model="shared", label="shared-bob"),
        factories.job(ann, model="only0", label="only0"),
        factories.job(bob, model="only1", label="only1"),
    ]
    wait_for(lambda: all_succeeded(jobs), message="every job to succeed", timeout=60)

    assert "only0" in gpus.ran_on("gpu0") and "only0" not in gpus.ran_on("gpu1")
    assert "only1" in gpus.ran_on("gpu1") and "only1" not in gpus.ran_on("gpu0")
    shared = [
        entry
        for sim in gpus.sims.values()
        for entry in sim.log()
        if entry["model"] == "shared" and entry["status"] == 200
    ]
    assert len(shared) == 2 and {e["body"]["user"] for e in shared} == {"shared-ann", "shared-bob"}
    first, second = sorted(shared, key=lambda e: e["started_at"])
    assert second["started_at"] < first["finished_at"], "the shared model ran on both at once"
    for name in gpus.sims:  # each job's recorded GPU is the one that answered it
        for entry in Job.objects.filter(pk__in=[j.pk for j in jobs], gpu__name=name):
            assert entry.body["user"] in gpus.ran_on(name)


def test_a_stopped_llama_swap_sends_its_jobs_to_the_other_gpu_and_health_names_it(world, make_gpus):
    gpus = make_gpus({"chat": 0.05}, {"chat": 0.05})
    gpus.start("gpu0")
    gpus.start("gpu1")
    web = world.start_web(upstream_url=gpus.upstreams)
    gpus.sims["gpu0"].stop()
    ann, _ = factories.member("ann", "pro")
    bob, _ = factories.member("bob", "pro")
    jobs = [
        factories.job(owner, model="chat", label=f"j{i}") for i in range(3) for owner in (ann, bob)
    ]
    wait_for(lambda: all_succeeded(jobs), message="every job to succeed on gpu1", timeout=60)

    assert sorted(gpus.ran_on("gpu1")) == sorted(j.body["user"] for j in jobs)  # each once
    assert set(
        Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("gpu__name", flat=True)
    ) == {"gpu1"}

    def gpu0_down() -> dict | None:
        health = httpx.get(f"{web.url}/api/health/", timeout=10).json()
        entry = next(g for g in health["gpus"] if g["name"] == "gpu0")
        return health if entry["healthy"] is False else None

    health = wait_for(gpu0_down, message="health to name gpu0 as down")
    assert health["status"] == "degraded"
    assert next(g for g in health["gpus"] if g["name"] == "gpu1")["healthy"] is True


@pytest.mark.slow
def test_a_killed_dispatchers_job_reruns_after_its_lease_while_the_other_gpu_works(
    world, make_gpus
):
    factories.policy(lease_seconds=1.0)
    gpus = make_gpus({"render": 4.0}, {"chat": 0.05})
    doomed = gpus.start("gpu0")
    gpus.start("gpu1")
    ann, _ = factories.member("ann", "pro")
    bob, _ = factories.member("bob", "pro")
    wait_for(
        lambda: Gpu.objects.filter(name="gpu0", served_models__contains=["render"]).exists(),
        message="gpu0's dispatcher to read its models",
    )
    render = factories.job(ann, model="render", label="render")
    wait_for(lambda: gpus.sims["gpu0"].log(), message="the render to reach gpu0")
    doomed.kill()
    chats = [factories.job(bob, model="chat", label=f"chat{i}") for i in range(3)]
    wait_for(lambda: all_succeeded(chats), message="gpu1 to go on working", timeout=60)
    # gpu1's dispatcher re-queues the render once its lease expires; only gpu0 runs it.
    wait_for(
        lambda: Job.objects.get(pk=render.pk).status == JobStatus.QUEUED,
        message="the render to be re-queued after its lease",
    )
    gpus.start("gpu0")
    wait_for(
        lambda: Job.objects.get(pk=render.pk).status == JobStatus.SUCCEEDED,
        message="the render to run again on gpu0",
        timeout=60,
    )
    render = Job.objects.get(pk=render.pk)
    assert render.attempts == 2 and render.gpu.name == "gpu0"
    assert gpus.ran_on("gpu0") == ["render"]  # the killed attempt never answered
    assert "render" not in gpus.ran_on("gpu1")


def test_two_web_servers_on_redis_show_a_dispatchers_change_to_their_viewers(world, make_gpus):
    if not redis_available():
        if os.environ.get("CI"):
            pytest.fail(f"Redis is not reachable at {REDIS_URL}")
        pytest.skip(f"Redis is not reachable at {REDIS_URL}")
    gpus = make_gpus({"chat": 0.05}, {"render": 1.0})
    gpus.world.env["REDIS_URL"] = REDIS_URL  # every process of the stack
    gpus.start("gpu0")
    gpus.start("gpu1")
    webs = [world.start_web(upstream_url=gpus.upstreams) for _ in range(2)]
    member, token = factories.member("ann", "pro")
    wait_for(
        lambda: Gpu.objects.filter(name="gpu1", served_models__contains=["render"]).exists(),
        message="gpu1's dispatcher to read its models",
    )
    with Watcher(webs[0].url, token) as first, Watcher(webs[1].url, token) as second:
        created = httpx.post(
            f"{webs[0].url}/api/jobs/",
            json={"path": "/v1/chat/completions", "body": factories.chat_body("render")},
            headers={"Authorization": f"Bearer {token}"},
        )
        assert created.status_code == 201, created.text
        job_id = created.json()["id"]
        for watcher in (first, second):
            watcher.wait_for_state(job_id, "running")
            running = next(e for e in watcher.state["running_all"] if e["id"] == job_id)
            assert running["gpu"] == "gpu1"
            gpu1 = next(g for g in watcher.state["gpus"] if g["name"] == "gpu1")
            assert gpu1["running_job"] == job_id and "url" not in gpu1
        for watcher in (first, second):
            watcher.wait_for_state(job_id, "gone")
    assert Job.objects.get(pk=job_id).gpu.name == "gpu1"


def test_a_reserved_gpu_never_starts_a_long_batch_job_and_interactive_work_finds_it(
    world, make_gpus
):
    gpus = make_gpus({"render": 3.0, "chat": 0.05}, {"render": 3.0, "chat": 0.05})
    for name in ("gpu0", "gpu1"):
        gpus.start(name)
    wait_for(
        lambda: Gpu.objects.filter(served_models__contains=["render"]).count() == 2,
        message="both dispatchers to read their GPU's models",
    )
    reserved = Gpu.objects.get(name="gpu0")
    services.gpu_update(
        gpu=reserved, enabled=True, allowed_models=[], min_band=0, max_expected_seconds=None
    )
    ann, _ = factories.member("ann", "pro")
    bob, _ = factories.member("bob", "pro")
    carl, _ = factories.member("carl", "free")
    renders = [
        factories.job(owner, model="render", priority="batch", label=f"render-{owner}")
        for owner in (ann, bob)
    ]
    wait_for(lambda: gpus.sims["gpu1"].log(), message="a render to start on gpu1")
    chat = factories.job(carl, model="chat", priority="interactive", label="interactive")
    wait_for(lambda: all_succeeded([chat]), message="the interactive job to run", timeout=60)
    wait_for(lambda: all_succeeded(renders), message="both renders to run", timeout=60)
    first_render = gpus.sims["gpu1"].log()[0]
    interactive = next(e for e in gpus.sims["gpu0"].log() if e["body"]["user"] == "interactive")
    # It started while the render ran on the other GPU, not after it.
    assert interactive["started_at"] < first_render["finished_at"]
    assert gpus.ran_on("gpu0") == ["interactive"]  # never a render on the reserved GPU
    assert sorted(gpus.ran_on("gpu1")) == sorted(r.body["user"] for r in renders)


def test_front_door_calls_run_on_every_gpu_at_once(world, make_gpus):
    gpus = make_gpus({"chat": 1.0}, {"chat": 1.0})
    gpus.start("gpu0")
    gpus.start("gpu1")
    web = world.start_web(upstream_url=gpus.upstreams)
    tokens = [factories.member(name, "pro")[1] for name in ("ann", "bob")]
    wait_for(
        lambda: Gpu.objects.filter(served_models__contains=["chat"]).count() == 2,
        message="both dispatchers to read their GPU's models",
    )

    def call(token: str, label: str) -> httpx.Response:
        return httpx.post(
            f"{web.url}/v1/chat/completions",
            json={"model": "chat", "messages": [], "user": label},
            headers={"Authorization": f"Bearer {token}"},
            timeout=60,
        )

    with ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(call, tokens, ["front-ann", "front-bob"]))
    assert [answer.status_code for answer in answers] == [200, 200]
    jobs = {
        label: Job.objects.get(pk=int(answer.headers["x-gpusched-job-id"]))
        for label, answer in zip(["front-ann", "front-bob"], answers, strict=True)
    }
    assert {job.gpu.name for job in jobs.values()} == {"gpu0", "gpu1"}
    for label, job in jobs.items():
        assert gpus.ran_on(job.gpu.name) == [label]  # relayed by the GPU it was granted
    served = [e for sim in gpus.sims.values() for e in sim.log() if e["status"] == 200]
    first, second = sorted((e["received_at"], e["finished_at"]) for e in served)
    assert second[0] < first[1], "the two calls ran side by side"


def test_each_gpu_takes_the_job_of_the_model_it_has_loaded(world, make_gpus):
    gpus = make_gpus({"model-b": 0.05, "model-c": 0.05}, {"model-b": 0.05, "model-c": 0.05})
    for name, model in (("gpu0", "model-b"), ("gpu1", "model-c")):  # as another client would
        httpx.post(
            f"{gpus.sims[name].url}/v1/chat/completions", json=factories.chat_body(model)
        ).raise_for_status()
        gpus.sims[name].reset_log()
    factories.policy(dispatch_paused=True)
    gpus.start("gpu0")
    gpus.start("gpu1")
    ann, _ = factories.member("ann", "pro")
    bob, _ = factories.member("bob", "pro")
    # Submitted so that, without affinity per GPU, gpu0 would take model-c's job first.
    jobs = [
        factories.job(ann, model="model-c", label="for-c"),
        factories.job(bob, model="model-b", label="for-b"),
    ]
    factories.policy(dispatch_paused=False)
    wait_for(lambda: all_succeeded(jobs), message="both jobs to run", timeout=60)
    assert gpus.ran_on("gpu0") == ["for-b"] and gpus.ran_on("gpu1") == ["for-c"]
    assert not any(entry["swapped"] for sim in gpus.sims.values() for entry in sim.log()), (
        "neither GPU swapped models"
    )


def _overlapping(gpus: TwoGpus) -> int:
    """Pairs of answered requests, one per GPU, that ran at the same time."""
    answered = {
        name: [e for e in sim.log() if e["status"] == 200] for name, sim in gpus.sims.items()
    }
    return sum(
        1
        for a in answered["gpu0"]
        for b in answered["gpu1"]
        if a["started_at"] < b["finished_at"] and b["started_at"] < a["finished_at"]
    )


@pytest.mark.parametrize("strict", [False, True])
def test_one_members_backlog_runs_on_both_gpus_unless_the_tier_is_strict(world, make_gpus, strict):
    gpus = make_gpus({"image": 0.4}, {"image": 0.4})
    Tier.objects.filter(pk=factories.tiers()["pro"].pk).update(strict_running_limit=strict)
    gpus.start("gpu0")
    gpus.start("gpu1")
    ann, _ = factories.member("ann", "pro")  # pro: a running limit of 1
    wait_for(
        lambda: Gpu.objects.filter(served_models__contains=["image"]).count() == 2,
        message="both dispatchers to read their GPU's models",
    )
    jobs = [factories.job(ann, model="image", label=f"shot{i}") for i in range(6)]
    wait_for(lambda: all_succeeded(jobs), message="the backlog to finish", timeout=60)

    decisions = Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list(
        "decisions__borrowed", flat=True
    )
    answers = [job_why(job=Job.objects.get(pk=j.pk), viewer=ann) for j in jobs]
    if strict:
        assert _overlapping(gpus) == 0, "a strict tier's member ran on both GPUs at once"
        assert not any(decisions)
        # On the GPU it ran on, or on the other one, whichever stood free.
        reasons = [
            told["reason"]
            for a in answers
            for told in [*a["parts"], *a["other_gpus"]]
            if "running limit" in told.get("reason", "")
        ]
        held_by = "your running limit (1) was held by job"
        assert any("was free" in r and held_by in r for r in reasons)
    else:
        assert gpus.ran_on("gpu0") and gpus.ran_on("gpu1")
        assert _overlapping(gpus) > 0, "the second GPU stood idle while the backlog waited"
        assert any(decisions)
        borrowed = [a for a in answers if a["borrowed"]]
        assert borrowed and all(
            "beyond your running limit (1): no other job could use it" in a["summary"]
            for a in borrowed
        )
