"""Estimates from the database when a model shares its GPU (queueapp/eta.py):
the running jobs of the GPU, each ending as runs at its level take, and the
model's `parallel` give the queued jobs of that model a slot at once."""

from datetime import datetime, timedelta

import pytest

from queueapp import services
from queueapp.eta import queue_forecast
from queueapp.models import Gpu, Job, JobStatus, ModelSetting
from queueapp.policy import batched_seconds
from queueapp.selectors import db_now
from queueapp.services.run_stats import run_stats_record
from tests import factories

pytestmark = pytest.mark.django_db

ALONE = 20.0  # what a chat run takes alone, learned


@pytest.fixture
def gpu0() -> Gpu:
    row = services.gpu_register(name="gpu0", url="http://127.0.0.1:9/gpu0")
    services.gpu_state_record(gpu_id=row.pk, reachable=True, resident_model="chat")
    return Gpu.objects.get(pk=row.pk)


def running(job: Job, *, on: Gpu, slot: int, in_flight: int, started: datetime) -> None:
    """`job` as the claim leaves it: running in `slot`, its decision saying
    `in_flight` jobs shared the GPU as it started."""
    Job.objects.filter(pk=job.pk).update(
        status=JobStatus.RUNNING,
        is_lane_head=False,
        started_at=started,
        gpu=on,
        gpu_slot=slot,
        lease_expires_at=started + timedelta(seconds=60),
    )
    factories.decision(job, gpu=on, gpu_slot=slot, in_flight=in_flight)


@pytest.fixture
def two_chats_running(default_tiers, gpu0) -> tuple[Job, Job, datetime]:
    """Two chats running on gpu0 (parallel 4): ann's alone 5 s ago, bob's
    beside it 2 s ago."""
    ModelSetting.objects.create(name="chat", parallel=4)
    run_stats_record(model="chat", path="/v1/chat/completions", seconds=ALONE, swapped=False)
    now = db_now()  # the test's transaction: the forecast's clock too
    ann_job = factories.job(factories.member("ann")[0], model="chat")
    bob_job = factories.job(factories.member("bob")[0], model="chat")
    running(ann_job, on=gpu0, slot=0, in_flight=1, started=now - timedelta(seconds=5))
    running(bob_job, on=gpu0, slot=1, in_flight=2, started=now - timedelta(seconds=2))
    return ann_job, bob_job, now


def test_queued_chats_take_the_free_slots_now_and_the_next_at_the_first_end(two_chats_running):
    ann_job, bob_job, now = two_chats_running
    queued = [factories.job(factories.member(name)[0], model="chat") for name in "cde"]
    forecast = queue_forecast()
    assert forecast.now == now
    assert [place.job_id for place in forecast.order] == [job.pk for job in queued]
    starts = [(forecast.start_of(place) - now).total_seconds() for place in forecast.order]
    # Ann's run alone ends 15 s from now; bob's (two in flight: unlearned,
    # derived from the run alone) 21 s from now.
    assert forecast.expected_end_of(ann_job.pk) == now + timedelta(seconds=15)
    bob_end = batched_seconds(ALONE, 2) - 2
    assert forecast.expected_end_of(bob_job.pk) == now + timedelta(seconds=bob_end)
    assert starts == pytest.approx([0.0, 0.0, 15.0])
    assert [place.in_flight for place in forecast.order] == [3, 4, 4]
    assert forecast.order[0].estimated_seconds == pytest.approx(batched_seconds(ALONE, 3))
    # The GPU frees when its last job in flight ends.
    assert forecast.gpu_free_at_for("gpu0") == now + timedelta(seconds=bob_end)


def test_a_higher_band_job_of_another_model_waits_for_the_gpu_to_drain(two_chats_running):
    _, _, now = two_chats_running
    video = factories.job(factories.member("vic")[0], model="video", priority="interactive")
    chat = factories.job(factories.member("cat")[0], model="chat")
    forecast = queue_forecast()
    starts = {
        place.job_id: (forecast.start_of(place) - now).total_seconds() for place in forecast.order
    }
    bob_end = batched_seconds(ALONE, 2) - 2
    assert starts[video.pk] == pytest.approx(bob_end)
    assert starts[chat.pk] > starts[video.pk]


def test_the_job_view_shows_a_free_slot_as_a_start_now(api, two_chats_running):
    carl, token = factories.member("carl")
    job = factories.job(carl, model="chat")
    estimate = api.as_member(token).get(f"/api/jobs/{job.pk}/").json()["estimate"]
    assert estimate["position"] == 1
    assert estimate["seconds_until_start"] == 0.0
    assert estimate["run_seconds"] == pytest.approx(round(batched_seconds(ALONE, 3), 1))
