"""Several GPUs claiming from one queue, against real PostgreSQL: each GPU
claims only what it runs, with its own resident model; a member's running
limit holds across GPUs; claims for two GPUs never take the same job; a
job is left to an idle GPU that has its model loaded, never across a band."""

from __future__ import annotations

import threading

import psycopg
import pytest

from queueapp import services
from queueapp.dispatch.claim import ClaimedJob, NoClaim, job_claim_next
from queueapp.errors import InvalidInput
from queueapp.live.events import listener_connection_params
from queueapp.models import DispatchDecision, Gpu, GpuIdle, Job, JobStatus, RunStats, Tier
from queueapp.selectors import db_now
from queueapp.why import job_why
from tests import factories

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.database_server]


def gpu(name: str, *, serves: list[str] | None = None, resident: str | None = None) -> Gpu:
    """A registered GPU whose dispatcher saw llama-swap up, serving `serves`."""
    row = services.gpu_register(name=name, url=f"http://127.0.0.1:9/{name}")
    services.gpu_state_record(
        gpu_id=row.pk, reachable=True, resident_model=resident, served_models=serves
    )
    return Gpu.objects.get(pk=row.pk)


def claim(on: Gpu, resident: str | None = None) -> ClaimedJob | None:
    outcome = job_claim_next(resident_model=resident, worker=f"test-{on.name}", gpu=on.pk)
    assert isinstance(outcome, ClaimedJob | NoClaim), outcome
    return outcome if isinstance(outcome, ClaimedJob) else None


def test_a_gpu_claims_only_the_models_it_serves(default_tiers, dispatchers_alive):
    gpu0, gpu1 = gpu("gpu0", serves=["chat"]), gpu("gpu1", serves=["chat", "video"])
    dispatchers_alive(gpu0, gpu1)
    ann, _ = factories.member("ann", "max")
    video = factories.job(ann, model="video", priority="interactive")
    chat = factories.job(ann, model="chat", priority="batch")

    first = claim(gpu0)
    assert first is not None and first.job_id == chat.pk  # video outranks it, but not here
    Job.objects.filter(pk=chat.pk).update(status=JobStatus.SUCCEEDED)
    second = claim(gpu1)
    assert second is not None and second.job_id == video.pk
    assert Job.objects.get(pk=video.pk).gpu_id == gpu1.pk
    assert DispatchDecision.objects.get(job=video).gpu_id == gpu1.pk


def test_affinity_is_per_gpu(default_tiers, dispatchers_alive):
    gpu0 = gpu("gpu0", serves=["b", "c"], resident="b")
    gpu1 = gpu("gpu1", serves=["b", "c"], resident="c")
    dispatchers_alive(gpu0, gpu1)
    ann, _ = factories.member("ann", "pro")
    bob, _ = factories.member("bob", "pro")
    for_c = factories.job(ann, model="c")
    for_b = factories.job(bob, model="b")

    on_gpu0, on_gpu1 = claim(gpu0, resident="b"), claim(gpu1, resident="c")
    assert (on_gpu0.job_id, on_gpu1.job_id) == (for_b.pk, for_c.pk)
    assert not on_gpu0.swap_needed and not on_gpu1.swap_needed


def test_a_strict_running_limit_holds_across_gpus(default_tiers, dispatchers_alive):
    gpu0, gpu1 = gpu("gpu0"), gpu("gpu1")
    dispatchers_alive(gpu0, gpu1)
    Tier.objects.filter(name="max").update(max_running_jobs=1, strict_running_limit=True)
    ann, _ = factories.member("ann", "max")
    bob, _ = factories.member("bob", "free")
    anns = [factories.job(ann, priority="interactive", model=m) for m in ("a", "b")]
    bobs = factories.job(bob, priority="batch", model="a")

    assert claim(gpu0).job_id == anns[0].pk
    assert claim(gpu1).job_id == bobs.pk  # ann's second waits for her first
    Job.objects.filter(pk=bobs.pk).update(status=JobStatus.SUCCEEDED)
    assert claim(gpu1) is None  # strict: gpu1 stands idle
    Job.objects.filter(pk=anns[0].pk).update(status=JobStatus.SUCCEEDED)
    assert claim(gpu1).job_id == anns[1].pk
    assert not DispatchDecision.objects.get(job=anns[1]).borrowed


def test_a_gpu_no_one_else_can_use_is_lent_past_the_running_limit(default_tiers, dispatchers_alive):
    gpu0, gpu1 = gpu("gpu0"), gpu("gpu1")
    dispatchers_alive(gpu0, gpu1)
    ann, _ = factories.member("ann", "max")
    bob, _ = factories.member("bob", "free")
    anns = [factories.job(ann, priority="interactive", model=m) for m in ("a", "b", "a")]
    bobs = factories.job(bob, priority="batch", model="a")

    assert claim(gpu0).job_id == anns[0].pk
    # Under contention the limit is a share: bob's job, not ann's second.
    assert claim(gpu1).job_id == bobs.pk
    assert not DispatchDecision.objects.get(job=bobs).borrowed
    Job.objects.filter(pk=bobs.pk).update(status=JobStatus.SUCCEEDED)
    # gpu1 would stand idle: ann borrows it.
    assert claim(gpu1).job_id == anns[1].pk
    assert DispatchDecision.objects.get(job=anns[1]).borrowed


def test_the_borrowing_guard_keeps_a_gpu_idle(default_tiers, dispatchers_alive):
    gpus = [gpu("gpu0"), gpu("gpu1"), gpu("gpu2")]
    dispatchers_alive(*gpus)
    factories.policy(borrow_keep_idle_gpus=1)
    ann, _ = factories.member("ann", "max")
    anns = [factories.job(ann, priority="batch", model="a") for _ in range(3)]

    assert claim(gpus[0]).job_id == anns[0].pk
    assert claim(gpus[1]).job_id == anns[1].pk  # gpu2 still stands idle
    assert claim(gpus[2]) is None  # the last idle GPU is kept for another member
    Job.objects.filter(pk=anns[0].pk).update(status=JobStatus.SUCCEEDED)
    assert claim(gpus[2]).job_id == anns[2].pk  # gpu0 is idle now


def test_claims_for_two_gpus_at_once_never_take_one_job_twice(default_tiers, dispatchers_alive):
    gpus = [gpu("gpu0"), gpu("gpu1")]
    dispatchers_alive(*gpus)
    members = [factories.member(f"m{i}", "pro")[0] for i in range(8)]
    jobs = [factories.job(owner, model="a") for owner in members for _ in range(3)]
    claimed: dict[str, list[int]] = {g.name: [] for g in gpus}

    def drain(on: Gpu) -> None:
        while (outcome := claim(on)) is not None:
            claimed[on.name].append(outcome.job_id)
            Job.objects.filter(pk=outcome.job_id).update(status=JobStatus.SUCCEEDED)

    threads = [threading.Thread(target=drain, args=(g,)) for g in gpus]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    everything = claimed["gpu0"] + claimed["gpu1"]
    assert sorted(everything) == sorted(job.pk for job in jobs)
    assert claimed["gpu0"] and claimed["gpu1"]
    by_gpu = dict(DispatchDecision.objects.values_list("job_id", "gpu__name"))
    assert all(by_gpu[job_id] == name for name, ids in claimed.items() for job_id in ids)


def test_a_disabled_gpu_claims_nothing(default_tiers):
    gpu0 = gpu("gpu0")
    ann, _ = factories.member("ann", "pro")
    factories.job(ann, model="a")
    services.gpu_update(
        gpu=gpu0, enabled=False, allowed_models=[], min_band=None, max_expected_seconds=None
    )
    assert claim(gpu0) is None
    services.gpu_update(
        gpu=gpu0, enabled=True, allowed_models=[], min_band=None, max_expected_seconds=None
    )
    assert claim(gpu0) is not None


def reserve(on: Gpu, *, min_band: int | None, max_expected_seconds: float | None) -> None:
    services.gpu_update(
        gpu=on,
        enabled=True,
        allowed_models=[],
        min_band=min_band,
        max_expected_seconds=max_expected_seconds,
    )


def learned(model: str, seconds: float) -> None:
    """RunStats as if `model` had finished a run of `seconds` without a swap."""
    RunStats.objects.create(
        model=model, path="/v1/chat/completions", warm_seconds=seconds, warm_samples=1
    )


def test_a_reserved_gpu_takes_high_bands_or_short_jobs_only(default_tiers, dispatchers_alive):
    gpu0, gpu1 = gpu("gpu0"), gpu("gpu1")
    dispatchers_alive(gpu0, gpu1)
    reserve(gpu0, min_band=0, max_expected_seconds=60)
    learned("render", 960.0)
    learned("chat", 2.0)
    ann, _ = factories.member("ann", "max")
    bob, _ = factories.member("bob", "pro")
    carl, _ = factories.member("carl", "free")
    render = factories.job(ann, model="render", priority="batch")  # long, low band: never gpu0
    short = factories.job(bob, model="chat", priority="batch")  # low band, but short
    assert claim(gpu0).job_id == short.pk  # the render outranks it, but not here
    Job.objects.filter(pk=short.pk).update(status=JobStatus.SUCCEEDED)
    assert claim(gpu0) is None  # only the render is left, and gpu0 does not take it
    interactive = factories.job(carl, model="render", priority="interactive")
    assert claim(gpu0).job_id == interactive.pk  # its band is admitted, however long
    assert claim(gpu1).job_id == render.pk


def test_a_reservation_by_band_alone_keeps_every_lower_band_out(default_tiers):
    gpu0 = gpu("gpu0")
    reserve(gpu0, min_band=0, max_expected_seconds=None)
    learned("chat", 1.0)
    ann, _ = factories.member("ann", "pro")
    factories.job(ann, model="chat", priority="batch")
    assert claim(gpu0) is None
    normal = factories.job(ann, model="chat", priority="normal")
    assert claim(gpu0).job_id == normal.pk


def test_a_job_goes_to_the_idle_gpu_with_its_model_loaded_within_its_band(
    default_tiers, dispatchers_alive
):
    gpu0 = gpu("gpu0", serves=["a", "b"], resident="a")
    gpu1 = gpu("gpu1", serves=["a", "b"], resident="b")
    dispatchers_alive(gpu0, gpu1)
    factories.policy(swap_affinity_bonus=0)  # so that for_b outranks for_a on gpu0 too
    ann, _ = factories.member("ann", "max")
    bob, _ = factories.member("bob", "free")
    for_b = factories.job(ann, model="b", priority="interactive")
    for_a = factories.job(bob, model="a", priority="interactive")
    # gpu0 leaves the b job to gpu1, which has b loaded and stands idle.
    assert claim(gpu0, resident="a").job_id == for_a.pk
    assert claim(gpu1, resident="b").job_id == for_b.pk


def test_placement_never_crosses_a_band(default_tiers, dispatchers_alive):
    gpu0 = gpu("gpu0", serves=["a", "b"], resident="a")
    gpu1 = gpu("gpu1", serves=["a", "b"], resident="b")
    dispatchers_alive(gpu0, gpu1)
    ann, _ = factories.member("ann", "pro")
    bob, _ = factories.member("bob", "pro")
    for_b = factories.job(ann, model="b", priority="interactive")
    factories.job(bob, model="a", priority="batch")
    # The only job of gpu0's model is of a lower band: gpu0 takes the b job.
    assert claim(gpu0, resident="a").job_id == for_b.pk


def test_a_model_no_gpu_serves_is_refused_at_submission(default_tiers):
    gpu("gpu0", serves=["chat"])
    gpu("gpu1", serves=["chat", "image"])
    ann, _ = factories.member("ann", "pro")
    with pytest.raises(InvalidInput) as refused:
        factories.job(ann, model="video")
    assert refused.value.field == "model"
    assert "chat, image" in refused.value.message
    factories.job(ann, model="image")  # served by one: accepted


def test_one_gpu_runs_any_model_as_a_single_llama_swap_does(default_tiers):
    gpu0 = gpu("gpu0", serves=["chat"])
    ann, _ = factories.member("ann", "pro")
    unlisted = factories.job(ann, model="unlisted-model")
    assert claim(gpu0).job_id == unlisted.pk


def test_why_says_the_wait_for_the_members_own_running_job(default_tiers, dispatchers_alive):
    gpu0, gpu1 = gpu("gpu0"), gpu("gpu1")
    dispatchers_alive(gpu0, gpu1)
    Tier.objects.filter(name="pro").update(strict_running_limit=True)
    ann, _ = factories.member("ann", "pro")  # pro runs one of a member's jobs at once
    first = factories.job(ann, model="a")
    second = factories.job(ann, model="b")
    assert claim(gpu0).job_id == first.pk
    assert claim(gpu1) is None  # gpu1 stands idle: ann's second waits for her first
    Job.objects.filter(pk=first.pk).update(status=JobStatus.SUCCEEDED, finished_at=db_now())
    assert claim(gpu1).job_id == second.pk

    answer = job_why(job=Job.objects.get(pk=second.pk), viewer=ann)
    held = [part for part in answer["parts"] if part["kind"] == "running_limit"]
    assert held and held[0]["seconds"] > 0
    assert held[0]["reason"].startswith(
        f"gpu1 was free but your running limit (1) was held by job {first.pk} on gpu0"
    )
    assert "tier pro runs 1 of a member's jobs at once" in held[0]["reason"]
    assert held[0]["held_by"] == [{"id": first.pk, "gpu": "gpu0"}]
    assert answer["gpu"] == "gpu1"
    assert not answer["borrowed"]
    assert answer["parts_total_seconds"] == pytest.approx(answer["measured_wait_seconds"], abs=0.01)
    assert "while your own job ran elsewhere" in answer["summary"] or held[0]["seconds"] < 1


def test_why_reads_the_running_limit_from_the_kept_reasons(default_tiers, dispatchers_alive):
    """The wait for the member's own job is told from what the claims kept
    (the idle gpu1's record, moved into the start that ended it), not from
    history: with the job that held the limit deleted, the answer stays."""
    gpu0, gpu1 = gpu("gpu0"), gpu("gpu1")
    dispatchers_alive(gpu0, gpu1)
    Tier.objects.filter(name="pro").update(strict_running_limit=True)
    ann, _ = factories.member("ann", "pro")
    first = factories.job(ann, model="a")
    second = factories.job(ann, model="b")
    assert claim(gpu0).job_id == first.pk
    assert claim(gpu1) is None  # gpu1 stands idle: ann's second waits for her first
    idle = GpuIdle.objects.get(gpu=gpu1)
    assert idle.skips["capped_members"] == [ann.pk]
    assert idle.skips["holding"][str(ann.pk)]["jobs"] == [[first.pk, "gpu0"]]
    Job.objects.filter(pk=first.pk).update(status=JobStatus.SUCCEEDED, finished_at=db_now())
    assert claim(gpu1).job_id == second.pk
    started = DispatchDecision.objects.get(job=second)
    assert started.idle_reason["skips"]["capped_members"] == [ann.pk]
    assert not GpuIdle.objects.filter(gpu=gpu1).exists()  # moved into the decision

    Job.objects.filter(pk=first.pk).delete()  # the history the old answer read

    answer = job_why(job=Job.objects.get(pk=second.pk), viewer=ann)
    (held,) = [part for part in answer["parts"] if part["kind"] == "running_limit"]
    assert held["seconds"] > 0
    assert held["reason"].startswith(
        f"gpu1 was free but your running limit (1) was held by job {first.pk} on gpu0"
    )
    assert held["held_by"] == [{"id": first.pk, "gpu": "gpu0"}]
    assert answer["parts_total_seconds"] == pytest.approx(answer["measured_wait_seconds"], abs=0.01)


def test_why_says_a_job_ran_beyond_the_running_limit(default_tiers, dispatchers_alive):
    gpu0, gpu1 = gpu("gpu0"), gpu("gpu1")
    dispatchers_alive(gpu0, gpu1)
    ann, _ = factories.member("ann", "pro")
    first = factories.job(ann, model="a")
    second = factories.job(ann, model="b")
    assert claim(gpu0).job_id == first.pk
    assert claim(gpu1).job_id == second.pk  # no one else could use gpu1

    answer = job_why(job=Job.objects.get(pk=second.pk), viewer=ann)
    assert answer["borrowed"]
    assert answer["gpu"] == "gpu1"
    assert (
        "It ran on gpu1 beyond your running limit (1): no other job could use it."
        in (answer["summary"])
    )
    # At most the claim's own milliseconds between the submission and the loan.
    assert all(p["seconds"] < 1 for p in answer["parts"] if p["kind"] == "running_limit")


def test_a_claim_skips_the_job_another_gpus_claim_is_starting(default_tiers, dispatchers_alive):
    gpu0, gpu1 = gpu("gpu0"), gpu("gpu1")
    dispatchers_alive(gpu0, gpu1)
    ann, _ = factories.member("ann", "max")
    bob, _ = factories.member("bob", "pro")
    first = factories.job(ann, model="a")
    second = factories.job(bob, model="a")
    outcome: list[ClaimedJob | None] = []
    with psycopg.connect(**listener_connection_params()) as other_claim:
        # gpu0's claim holds the best job's row, as it marks it running.
        other_claim.execute("SELECT id FROM queueapp_job WHERE id = %s FOR UPDATE", [first.pk])
        claiming = threading.Thread(target=lambda: outcome.append(claim(gpu1)))
        claiming.start()
        claiming.join(timeout=5)
        held_row_skipped = not claiming.is_alive()
        other_claim.rollback()
        claiming.join(timeout=30)
    assert held_row_skipped, "gpu1's claim waited for the row gpu0's claim held"
    assert outcome[0] is not None and outcome[0].job_id == second.pk
    decision = DispatchDecision.objects.get(job=second)
    assert decision.candidates[0]["job_id"] == second.pk
