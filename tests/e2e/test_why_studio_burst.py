"""'Why did my job wait?' for a studio's burst, as `SIMULATED_GPUS=2
LLAMA_SWAP_CONFIG=fixtures/llama-swap/studio.yaml make run` serves it: two
simulated GPUs with llama-swap's studio config (resident sets, chat in
parallel slots), a dispatcher cluster for each, and the web server.

Three members send a mixed burst within a few seconds: three batch videos,
four images, a chat, an interactive speech job and an embedding. Every
job's answer is read from the API while some still wait, and again once all
have ended; each must add up to its wait (tests/why/timeline.py), and the
other GPU's work is told beside the parts, never counted in them.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpusched.stack import Stack, WebServer, wait_for
from queueapp import services
from queueapp.models import DispatchDecision, Gpu, Job, JobStatus, Member
from tests import factories
from tests.database import database_url
from tests.e2e.helpers import all_ended
from tests.why.timeline import assert_the_answer_adds_up

pytestmark = [pytest.mark.e2e]

STUDIO = factories.STUDIO_CONFIG
SWAP_SECONDS = 0.2
GPUS = ("gpu0", "gpu1")


class StudioBurst:
    """Two GPUs serving studio.yaml, their dispatchers, the web server and
    three members; `send` submits a job through the API."""

    def __init__(self, stack: Stack, web: WebServer) -> None:
        self.stack = stack
        self.web = web
        self.tokens: dict[int, str] = {}
        self.members: dict[str, Member] = {}
        for name, tier in (("ann", "pro"), ("bob", "free"), ("cat", "max")):
            member, token = factories.member(name, tier)
            self.members[name] = member
            self.tokens[member.pk] = token
        self.jobs: list[Job] = []

    def send(
        self, member: str, path: str, model: str, seconds: float, priority: str | None = None
    ) -> Job:
        body = {"model": model, "user": f"{model}-{len(self.jobs)}", "sim": {"seconds": seconds}}
        if path == "/v1/chat/completions":
            body["messages"] = [{"role": "user", "content": "hi"}]
        elif path == "/v1/embeddings":
            body["input"] = "a line to embed"
        else:
            body["prompt" if path.startswith("/v1/images") else "input"] = "a fox in the snow"
        payload: dict[str, Any] = {"path": path, "body": body}
        if priority is not None:
            payload["priority"] = priority
        response = httpx.post(
            f"{self.web.url}/api/jobs/",
            json=payload,
            headers=self._auth(self.members[member].pk),
            timeout=10,
        )
        assert response.status_code == 201, response.text
        job = Job.objects.get(pk=response.json()["id"])
        self.jobs.append(job)
        return job

    def why(self, job: Job) -> dict[str, Any]:
        response = httpx.get(
            f"{self.web.url}/api/jobs/{job.pk}/why/", headers=self._auth(job.member_id), timeout=10
        )
        assert response.status_code == 200, response.text
        answer: dict[str, Any] = response.json()
        return answer

    def _auth(self, member_id: int) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[member_id]}"}


@pytest.fixture
def studio(transactional_db, tmp_path: Path) -> Iterator[StudioBurst]:
    factories.policy()
    factories.tiers()
    # A batching chat server (llama-server --parallel 2, under studio.yaml's
    # concurrencyLimit 4): chats share the GPU in slots.
    services.model_parallel_set(name="chat-small", parallel=2)
    with Stack(database_url=database_url(), log_dir=tmp_path) as stack:
        sims = [
            stack.start_simulator(models={}, swap_seconds=SWAP_SECONDS, config=STUDIO) for _ in GPUS
        ]
        upstreams = ",".join(f"{name}={sim.url}" for name, sim in zip(GPUS, sims, strict=True))
        for name in GPUS:
            stack.start_cluster(
                upstream_url=upstreams, GPUSCHED_GPU=name, LLAMA_SWAP_CONFIG=str(STUDIO)
            )
        web = stack.start_web(upstream_url=upstreams, LLAMA_SWAP_CONFIG=str(STUDIO))
        wait_for(
            lambda: Gpu.objects.filter(routing__isnull=False).count() == len(GPUS),
            message="both dispatchers to record llama-swap's routing",
        )
        yield StudioBurst(stack, web)


def assert_no_other_gpu_counted(answer: dict[str, Any]) -> None:
    """The parts tell the explained GPU's timeline: every dispatch a part
    names was on that GPU, every job a drain names ran there; the other
    GPUs' work is in `other_gpus` alone."""
    gpu = answer["gpu"]
    assert gpu in GPUS, answer
    assert [entry["gpu"] for entry in answer["other_gpus"]] == [g for g in GPUS if g != gpu]
    for part in answer["parts"]:
        if part["kind"] == "own_earlier_attempt":
            continue  # the job's own time, on whichever GPU it ran
        if "decision" in part:
            decided_on = DispatchDecision.objects.get(pk=part["decision"]).gpu.name
            assert decided_on == gpu, (part, answer["other_gpus"])
        for ref in part.get("jobs", []):
            assert DispatchDecision.objects.filter(job_id=ref["id"], gpu__name=gpu).exists(), (
                part,
                answer["other_gpus"],
            )


def assert_every_answer_holds(studio: StudioBurst) -> list[dict[str, Any]]:
    answers = [studio.why(job) for job in studio.jobs]
    for answer in answers:
        assert_the_answer_adds_up(answer)
        assert_no_other_gpu_counted(answer)
    return answers


def test_a_studio_burst_on_two_gpus_every_answer_adds_up_waiting_and_ended(studio):
    # The batch videos and two images first; the rest once the GPUs work.
    # Ann's videos take 2.5 s each: the burst lasts long enough for its ten
    # answers to be read, on a busy machine, while some job still waits.
    for _ in range(3):
        studio.send("ann", "/v1/images/generations", "video-wan", 2.5, priority="batch")
    for _ in range(2):
        studio.send("bob", "/v1/images/generations", "image-xl", 0.4)
    wait_for(
        lambda: Job.objects.filter(status=JobStatus.RUNNING).exists(),
        message="the first of the burst to run",
    )
    studio.send("cat", "/v1/chat/completions", "chat-small", 1.0)
    studio.send("bob", "/v1/audio/speech", "tts-kokoro", 0.3, priority="interactive")
    for _ in range(2):
        studio.send("ann", "/v1/images/generations", "image-xl", 0.4)
    studio.send("cat", "/v1/embeddings", "embed-small", 0.2)

    while_waiting = assert_every_answer_holds(studio)
    assert any(answer["still_waiting"] for answer in while_waiting), [
        (answer["job"], answer["status"]) for answer in while_waiting
    ]

    wait_for(lambda: all_ended(studio.jobs), timeout=60, message="every job of the burst to end")
    assert set(
        Job.objects.filter(pk__in=[job.pk for job in studio.jobs]).values_list("status", flat=True)
    ) == {JobStatus.SUCCEEDED}
    ended = assert_every_answer_holds(studio)
    for answer in ended:
        job = Job.objects.get(pk=answer["job"])
        assert not answer["still_waiting"] and answer["gpu"] == job.gpu.name
        waited = (job.started_at - job.submitted_at).total_seconds()
        assert answer["measured_wait_seconds"] == pytest.approx(waited, abs=0.0015)
        assert datetime.fromisoformat(answer["started_at"]) == job.started_at
    # Both GPUs worked the burst: each answer had another GPU to tell apart.
    assert {answer["gpu"] for answer in ended} == set(GPUS)
