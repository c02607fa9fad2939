"""What jobs take, learned from finished ones (queueapp/eta.py): decayed
averages per model and path, warm runs apart from cold ones (a model swap
first), and the swap cost as their difference."""

import json
from datetime import timedelta

import pytest
from django.db.models import F

from queueapp.dispatch.claim import job_claim_next
from queueapp.dispatch.lease import job_end_durable
from queueapp.durations import Durations
from queueapp.models import Job, RunStats
from queueapp.policy.expected import DEFAULT_RUN_SECONDS, NEWEST_RUN_WEIGHT
from queueapp.services.run_stats import run_stats_record
from queueapp.upstream.client import UpstreamAnswer
from tests import factories

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


def record(model: str, seconds: float, *, path: str = CHAT, swapped: bool = False) -> None:
    run_stats_record(model=model, path=path, seconds=seconds, swapped=swapped)


@pytest.mark.django_db
def test_each_warm_run_weighs_0_3_in_the_decayed_average():
    assert NEWEST_RUN_WEIGHT == 0.3
    record("chat-small", 10)
    record("chat-small", 20)
    row = RunStats.objects.get(model="chat-small", path=CHAT)
    # The first run is the average; then 10 × 0.7 + 20 × 0.3.
    assert row.warm_seconds == pytest.approx(13.0)
    assert (row.warm_samples, row.cold_seconds, row.cold_samples) == (2, None, 0)
    assert Durations.load().run_seconds("chat-small", CHAT) == pytest.approx(13.0)


@pytest.mark.django_db
def test_the_swap_cost_is_the_cold_average_minus_the_warm_one():
    record("chat-small", 10)
    record("chat-small", 20)  # warm: 13
    record("chat-small", 18, swapped=True)  # cold: 18
    assert Durations.load().swap_seconds("chat-small") == pytest.approx(5.0)
    record("chat-small", 28, swapped=True)  # cold: 18 × 0.7 + 28 × 0.3 = 21
    durations = Durations.load()
    assert durations.swap_seconds("chat-small") == pytest.approx(8.0)
    # Cold runs do not move the warm average: a run is warm time alone.
    assert durations.run_seconds("chat-small", CHAT) == pytest.approx(13.0)
    row = RunStats.objects.get(model="chat-small", path=CHAT)
    assert (row.warm_samples, row.cold_samples) == (2, 2)


@pytest.mark.django_db
def test_a_swap_faster_than_a_warm_run_costs_nothing():
    record("chat-small", 10)
    record("chat-small", 7, swapped=True)
    record("image-xl", 8, path="/sdapi/v1/txt2img")
    record("image-xl", 11, path="/sdapi/v1/txt2img", swapped=True)
    # Measured as free, not another model's cost (3 s) as if never measured.
    assert Durations.load().swap_seconds("chat-small") == 0.0


@pytest.mark.django_db
def test_run_time_is_kept_per_model_and_path_and_swap_cost_per_model():
    record("chat-small", 10, path=CHAT)
    record("chat-small", 15, path=CHAT, swapped=True)  # swap 5 on this path
    record("chat-small", 30, path=COMPLETIONS)
    record("chat-small", 39, path=COMPLETIONS, swapped=True)  # swap 9 on this one
    record("image-xl", 8, path="/sdapi/v1/txt2img")
    record("image-xl", 11, path="/sdapi/v1/txt2img", swapped=True)  # swap 3
    durations = Durations.load()
    assert durations.run_seconds("chat-small", CHAT) == pytest.approx(10.0)
    assert durations.run_seconds("chat-small", COMPLETIONS) == pytest.approx(30.0)
    assert durations.run_seconds("image-xl", "/sdapi/v1/txt2img") == pytest.approx(8.0)
    # Loading a model costs the same whatever the path: the mean of its paths'.
    assert durations.swap_seconds("chat-small") == pytest.approx(7.0)
    assert durations.swap_seconds("image-xl") == pytest.approx(3.0)
    # A model never seen: the mean over the models seen, (5 + 9 + 3) / 3.
    assert durations.swap_seconds("video-wan") == pytest.approx(17 / 3)


@pytest.mark.django_db
def test_run_time_falls_back_to_the_model_then_to_all_models_then_the_default():
    assert Durations.load().run_seconds("chat-small", CHAT) == DEFAULT_RUN_SECONDS
    assert Durations.load().swap_seconds("chat-small") == 0.0
    record("chat-small", 10, path=CHAT)
    record("chat-small", 30, path=COMPLETIONS)
    record("image-xl", 8, path="/sdapi/v1/txt2img")
    record("image-xl", 11, path="/sdapi/v1/txt2img", swapped=True)  # swap 3
    record("chat-small", 25, path="/v1/embeddings", swapped=True)  # only ever cold
    durations = Durations.load()
    # Another path of a known model: the mean of that model's paths.
    assert durations.run_seconds("chat-small", "/v1/audio/speech") == pytest.approx(20.0)
    # A model never seen: the mean over every model and path, (10 + 30 + 8) / 3.
    assert durations.run_seconds("video-wan", CHAT) == pytest.approx(16.0)
    # Cold runs only: less the swap cost (chat-small has none of its own,
    # so the mean over the models seen: 3).
    assert durations.run_seconds("chat-small", "/v1/embeddings") == pytest.approx(22.0)


OK = UpstreamAnswer(200, "application/json", json.dumps({"ok": True}).encode(), None)


def finish_after(job: Job, *, resident_model: str, seconds: float) -> None:
    """Claim `job`, let it have run `seconds`, finish it as llama-swap answered."""
    claim = job_claim_next(resident_model=resident_model, worker="test")
    assert claim.job_id == job.pk
    Job.objects.filter(pk=job.pk).update(started_at=F("started_at") - timedelta(seconds=seconds))
    assert job_end_durable(claim=claim, answer=OK, error=None, inline_limit=4096)


@pytest.mark.django_db(transaction=True)
def test_a_finished_job_counts_as_warm_or_cold_by_whether_its_dispatch_swapped(default_tiers):
    ann, _ = factories.member("ann", "free")
    finish_after(factories.job(ann, model="chat-small"), resident_model="chat-small", seconds=10)
    finish_after(factories.job(ann, model="chat-small"), resident_model="image-xl", seconds=15)
    row = RunStats.objects.get(model="chat-small", path=CHAT)
    # Each run is its pretended length plus the test's own time (well under 1 s).
    assert row.warm_seconds == pytest.approx(10.0, abs=1.0)
    assert row.cold_seconds == pytest.approx(15.0, abs=1.0)
    assert Durations.load().swap_seconds("chat-small") == pytest.approx(5.0, abs=1.0)
    failed = factories.job(ann, model="chat-small")
    claim = job_claim_next(resident_model="chat-small", worker="test")
    error = UpstreamAnswer(500, "application/json", b'{"error": "boom"}', None)
    assert job_end_durable(claim=claim, answer=error, error=None, inline_limit=4096)
    assert Job.objects.get(pk=failed.pk).status == "failed"
    # A failed run says nothing about how long the model takes.
    row.refresh_from_db()
    assert (row.warm_samples, row.cold_samples) == (1, 1)
