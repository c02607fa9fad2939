"""Resident sets, as a user runs them: llama-swap's studio config
(fixtures/llama-swap/studio.yaml) served by the built-in simulator run as a
process of its own, a dispatcher reading the same file (LLAMA_SWAP_CONFIG).

- A TTS job starts beside a chat in flight; an image job waits for the TTS
  it unloads, not for the chat it keeps; nothing busy is ever unloaded.
- Over twenty jobs across every set, each job's predicted unloads are what
  the simulator unloaded, and the resident set gpusched shows afterwards is
  the simulator's `/running`.
- A config gpusched cannot use: one line, a degraded health, and one model
  at a time.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gpusched.stack import Stack, wait_for
from queueapp.models import DispatchDecision, Gpu, Job, JobStatus
from tests import factories
from tests.database import database_url
from tests.e2e.helpers import ended

pytestmark = [pytest.mark.e2e]

STUDIO = factories.STUDIO_CONFIG
SWAP_SECONDS = 0.2


class Studio:
    """The running stack, the simulator and a member."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.simulator = stack.simulators[0]
        self.member, self.token = factories.member("ann", "pro")

    def job(self, model: str, seconds: float, label: str) -> Job:
        return factories.job(self.member, model=model, seconds=seconds, label=label)

    def entry(self, label: str) -> dict:
        """The simulator's answered request of the job labelled `label`."""
        (found,) = [
            entry
            for entry in self.simulator.log()
            if (entry.get("body") or {}).get("user") == label and entry.get("status") == 200
        ]
        return found

    def started_at_simulator(self, label: str) -> bool:
        return any(
            (entry.get("body") or {}).get("user") == label and entry.get("started_at")
            for entry in self.simulator.log()
        )

    def running(self) -> list[str]:
        """The models the simulator's /running lists as ready, sorted."""
        answer = httpx.get(f"{self.simulator.url}/running", timeout=10).json()
        return sorted(entry["model"] for entry in answer["running"] if entry["state"] == "ready")


def _studio_stack(tmp_path: Path, config: Path) -> Iterator[Studio]:
    factories.policy()
    factories.tiers()
    with Stack(database_url=database_url(), log_dir=tmp_path) as stack:
        stack.start_simulator(models={}, swap_seconds=SWAP_SECONDS, config=STUDIO)
        stack.start_cluster(LLAMA_SWAP_CONFIG=str(config))
        yield Studio(stack)


@pytest.fixture
def studio(transactional_db, tmp_path) -> Iterator[Studio]:
    yield from _studio_stack(tmp_path, STUDIO)


def routing_read() -> None:
    """Until the dispatcher has recorded the routing: a job claimed before
    would run one model at a time."""
    wait_for(
        lambda: Gpu.objects.filter(routing__isnull=False).exists(),
        message="the dispatcher recorded llama-swap's routing",
    )


def never_unloaded_busy(log: list[dict]) -> None:
    """No request unloaded a model while a request of it was in flight."""
    answered = [entry for entry in log if entry.get("started_at") and entry.get("finished_at")]
    for entry in answered:
        for other in answered:
            if other["model"] in entry.get("unloaded", ()):
                overlaps = other["started_at"] < entry["started_at"] < other["finished_at"]
                assert not overlaps, (entry, other)


def test_tts_runs_beside_a_chat_and_an_image_waits_only_for_the_tts(studio):
    routing_read()
    chat = studio.job("chat-small", 4.0, "chat")
    wait_for(lambda: studio.started_at_simulator("chat"), message="the chat running")
    tts = studio.job("tts-kokoro", 0.5, "tts")
    wait_for(lambda: studio.started_at_simulator("tts"), message="the tts running")
    image = studio.job("image-xl", 0.5, "image")
    for job in (chat, tts, image):
        assert ended(job.pk).status == JobStatus.SUCCEEDED

    chat_run, tts_run, image_run = (studio.entry(label) for label in ("chat", "tts", "image"))
    # Side by side: the TTS started before the chat ended, and unloaded nothing.
    assert tts_run["started_at"] < chat_run["finished_at"]
    assert tts_run["unloaded"] == []
    # The image waited for the TTS it unloads, but not for the chat it keeps.
    assert image_run["started_at"] >= tts_run["finished_at"]
    assert image_run["started_at"] < chat_run["finished_at"]
    assert image_run["unloaded"] == ["tts-kokoro"]
    assert Job.objects.get(pk=tts.pk).swap == {"loads": "tts-kokoro", "unloads": []}
    assert Job.objects.get(pk=image.pk).swap == {"loads": "image-xl", "unloads": ["tts-kokoro"]}
    never_unloaded_busy(studio.simulator.log())

    why = studio.stack.start_web()
    answer = httpx.get(
        f"{why.url}/api/jobs/{image.pk}/why/",
        headers={"Authorization": f"Bearer {studio.token}"},
        timeout=10,
    ).json()
    assert answer["swap"] == {"loads": "image-xl", "unloads": ["tts-kokoro"]}
    assert "loading image-xl unloads tts-kokoro" in answer["summary"]


# Every set of studio.yaml, and its aliases: voice (chat, tts, embeddings),
# picture (chat, image) and the video alone.
MODELS = ["chat-small", "chat", "tts-kokoro", "tts", "embed-small", "image-xl", "video-wan"]


@pytest.mark.slow
def test_predicted_unloads_and_resident_sets_match_the_simulator_over_twenty_jobs(studio):
    routing_read()
    draw = random.Random(32)
    models = [draw.choice(MODELS) for _ in range(18)] + ["video-wan", "tts"]
    for index, model in enumerate(models):
        label = f"job-{index}"
        job = studio.job(model, 0.05, label)
        assert ended(job.pk).status == JobStatus.SUCCEEDED
        decision = DispatchDecision.objects.get(job=job)
        run = studio.entry(label)
        predicted = (decision.swap or {}).get("unloads", [])
        assert predicted == run["unloaded"], (label, model, decision.swap, run)
        wait_for(
            lambda: sorted(Gpu.objects.get().resident_models) == studio.running(),
            message=f"after {label} ({model}): gpusched's resident set is the simulator's",
        )
    never_unloaded_busy(studio.simulator.log())


@pytest.fixture
def broken_studio(transactional_db, tmp_path) -> Iterator[Studio]:
    broken = tmp_path / "broken.yaml"
    text = STUDIO.read_text(encoding="utf-8").replace('picture: "c & i"', 'picture: "c & nope"')
    broken.write_text(text, encoding="utf-8")
    yield from _studio_stack(tmp_path, broken)


def test_a_bad_config_is_one_line_a_degraded_health_and_one_model_at_a_time(broken_studio):
    wait_for(
        lambda: Gpu.objects.exclude(routing_error="").exists(),
        message="the config's problem recorded",
    )
    (line,) = Gpu.objects.values_list("routing_error", flat=True)
    assert "broken.yaml" in line and "nope" in line and "\n" not in line
    web = broken_studio.stack.start_web()
    health = httpx.get(f"{web.url}/api/health/", timeout=10).json()
    assert health["status"] == "degraded"
    assert any("nope" in problem for problem in health["problems"])

    chat = broken_studio.job("chat-small", 2.0, "chat")
    wait_for(lambda: broken_studio.started_at_simulator("chat"), message="the chat running")
    tts = broken_studio.job("tts-kokoro", 0.2, "tts")
    assert ended(tts.pk).status == JobStatus.SUCCEEDED
    chat_run, tts_run = broken_studio.entry("chat"), broken_studio.entry("tts")
    assert tts_run["started_at"] >= chat_run["finished_at"]  # one model at a time
    assert ended(chat.pk).status == JobStatus.SUCCEEDED
