"""Parallel slots, against real PostgreSQL: a GPU runs up to `parallel` jobs
of its loaded model at once; a job of another model waits for the GPU to
have nothing in flight, and while a better one waits, no new slot is given."""

from __future__ import annotations

import pytest

from queueapp import services
from queueapp.dispatch.claim import ClaimedJob, GpuBusy, NoClaim, job_claim_next
from queueapp.errors import InvalidInput, NotFound
from queueapp.models import DispatchDecision, Gpu, Job, JobStatus, ModelSetting
from tests import factories

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.database_server]


@pytest.fixture
def gpu0() -> Gpu:
    row = services.gpu_register(name="gpu0", url="http://127.0.0.1:9/gpu0")
    services.gpu_state_record(
        gpu_id=row.pk, reachable=True, resident_model="chat", served_models=["chat", "image"]
    )
    return Gpu.objects.get(pk=row.pk)


def claim(gpu: Gpu, resident: str | None = "chat") -> ClaimedJob | GpuBusy | None:
    outcome = job_claim_next(resident_model=resident, worker="test", gpu=gpu.pk)
    assert isinstance(outcome, ClaimedJob | GpuBusy | NoClaim), outcome
    return None if isinstance(outcome, NoClaim) else outcome


def end(job_id: int) -> None:
    Job.objects.filter(pk=job_id).update(status=JobStatus.SUCCEEDED)


def test_a_model_with_parallel_4_takes_four_slots_then_the_gpu_is_full(default_tiers, gpu0):
    services.model_parallel_set(name="chat", parallel=4)
    ann, _ = factories.member("ann", "pro")
    chats = [factories.job(ann, model="chat") for _ in range(5)]

    claims = [claim(gpu0) for _ in range(4)]
    assert all(isinstance(each, ClaimedJob) and each.shared for each in claims)
    assert [each.job_id for each in claims] == [job.pk for job in chats[:4]]
    assert [each.gpu_slot for each in claims] == [0, 1, 2, 3]
    assert [each.in_flight for each in claims] == [1, 2, 3, 4]
    decisions = DispatchDecision.objects.filter(job__in=chats[:4]).order_by("id")
    assert [(d.gpu_slot, d.in_flight) for d in decisions] == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert [d.swap_needed for d in decisions] == [False] * 4

    full = claim(gpu0)
    assert isinstance(full, GpuBusy) and not full.draining
    end(claims[1].job_id)  # slot 1 frees: the fifth takes it
    fifth = claim(gpu0)
    assert isinstance(fifth, ClaimedJob) and fifth.job_id == chats[4].pk
    assert fifth.gpu_slot == 1 and fifth.in_flight == 4


def test_a_better_job_of_another_model_stops_new_slots_and_starts_when_they_end(
    default_tiers, gpu0
):
    services.model_parallel_set(name="chat", parallel=4)
    ann, _ = factories.member("ann", "pro")
    bob, _ = factories.member("bob", "pro")
    first = factories.job(ann, model="chat")
    assert isinstance(started := claim(gpu0), ClaimedJob) and started.job_id == first.pk
    image = factories.job(bob, model="image", priority="interactive")
    later_chats = [factories.job(ann, model="chat") for _ in range(3)]

    draining = claim(gpu0)
    assert isinstance(draining, GpuBusy) and draining.draining
    assert Job.objects.filter(pk__in=[j.pk for j in later_chats], status="queued").count() == 3
    end(first.pk)
    swap = claim(gpu0)
    assert isinstance(swap, ClaimedJob) and swap.job_id == image.pk
    assert swap.swap_needed and swap.gpu_slot == 0 and swap.in_flight == 1
    assert not swap.shared  # image has no parallel setting: one at a time
    assert isinstance(claim(gpu0, resident="image"), GpuBusy)  # a chat waits for the image


def test_a_lower_band_job_of_another_model_does_not_stop_the_slots(default_tiers, gpu0):
    services.model_parallel_set(name="chat", parallel=3)
    ann, _ = factories.member("ann", "pro")
    bob, _ = factories.member("bob", "pro")
    factories.job(bob, model="image", priority="batch")
    chats = [factories.job(ann, model="chat", priority="interactive") for _ in range(3)]
    taken = [claim(gpu0) for _ in range(3)]
    assert [each.job_id for each in taken] == [job.pk for job in chats]
    assert isinstance(claim(gpu0), GpuBusy)


def test_without_a_setting_a_model_runs_one_job_at_a_time(default_tiers, gpu0):
    ann, _ = factories.member("ann", "pro")
    first, _second = factories.job(ann, model="chat"), factories.job(ann, model="chat")
    claimed = claim(gpu0)
    assert isinstance(claimed, ClaimedJob) and claimed.job_id == first.pk and not claimed.shared
    assert isinstance(claim(gpu0), GpuBusy)


def test_a_lowered_parallel_gives_no_slot_until_fewer_are_in_flight(default_tiers, gpu0):
    services.model_parallel_set(name="chat", parallel=3)
    ann, _ = factories.member("ann", "max")
    chats = [factories.job(ann, model="chat") for _ in range(4)]
    taken = [claim(gpu0) for _ in range(3)]
    services.model_parallel_set(name="chat", parallel=2)
    assert isinstance(claim(gpu0), GpuBusy)
    end(taken[0].job_id)
    assert isinstance(claim(gpu0), GpuBusy)  # still 2 in flight: the new limit
    end(taken[1].job_id)
    last = claim(gpu0)
    assert isinstance(last, ClaimedJob) and last.job_id == chats[3].pk
    assert last.gpu_slot == 0  # the lowest free slot


def test_the_setting_is_checked(default_tiers, gpu0):
    with pytest.raises(InvalidInput):
        services.model_parallel_set(name="chat", parallel=0)
    with pytest.raises(InvalidInput):
        services.model_parallel_set(name="chat", parallel=65)
    assert services.model_parallel_set(name="chat", parallel=64).parallel == 64
    assert ModelSetting.objects.get(name="chat").parallel == 64


def test_only_a_model_a_gpu_serves_can_be_set_when_every_list_is_known(default_tiers, gpu0):
    services.gpu_register(name="gpu1", url="http://127.0.0.1:9/gpu1")
    gpu1 = Gpu.objects.get(name="gpu1")
    services.gpu_state_record(
        gpu_id=gpu1.pk, reachable=True, resident_model=None, served_models=["video"]
    )
    with pytest.raises(NotFound, match="served: chat, image, video"):
        services.model_parallel_set(name="audio", parallel=2)
    assert services.model_parallel_set(name="video", parallel=2).parallel == 2


def test_slots_are_per_gpu(default_tiers, gpu0):
    row = services.gpu_register(name="gpu1", url="http://127.0.0.1:9/gpu1")
    services.gpu_state_record(
        gpu_id=row.pk, reachable=True, resident_model="chat", served_models=["chat", "image"]
    )
    gpu1 = Gpu.objects.get(pk=row.pk)
    services.model_parallel_set(name="chat", parallel=2)
    members = [factories.member(name, "pro")[0] for name in ("ann", "bob", "cy", "dee", "eve")]
    for member in members:
        factories.job(member, model="chat")

    on_gpu0 = [claim(gpu0), claim(gpu0)]
    on_gpu1 = [claim(gpu1), claim(gpu1)]
    assert [c.gpu_slot for c in on_gpu0] == [0, 1] == [c.gpu_slot for c in on_gpu1]
    assert {c.gpu_id for c in on_gpu0} == {gpu0.pk} and {c.gpu_id for c in on_gpu1} == {gpu1.pk}
    assert isinstance(claim(gpu0), GpuBusy) and isinstance(claim(gpu1), GpuBusy)
    running = Job.objects.filter(status=JobStatus.RUNNING)
    assert sorted(running.values_list("gpu_id", "gpu_slot")) == sorted(
        [(gpu0.pk, 0), (gpu0.pk, 1), (gpu1.pk, 0), (gpu1.pk, 1)]
    )
