"""Parallel slots on the virtual clock: several jobs of the resident model at
once, swaps only on an empty GPU, and the drain that lets a swap through."""

from __future__ import annotations

from dataclasses import replace
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from hypothesis import given, settings
from hypothesis import strategies as st

from queueapp.policy import MAX_PARALLEL, batched_seconds
from queueapp.simulation.baselines import POLICIES, make_policy
from queueapp.simulation.cluster import simulate_on_gpus
from queueapp.simulation.cluster_policies import CLUSTER_POLICIES, GpuschedOnGpus, compare_on_gpus
from queueapp.simulation.engine import Dispatch, Run, simulate
from queueapp.simulation.fleet import ParallelError, gpu_specs, parse_parallel
from queueapp.simulation.parallel import CHAT_HEAVY_PARALLEL, compare_parallel
from queueapp.simulation.slot_metrics import undone_drains
from queueapp.simulation.traces import TRACES_DIR, Tier, Trace, load_trace
from tests.simulation.helpers import drawn_jobs, job, trace

CHAT_HEAVY = TRACES_DIR / "chat-heavy.jsonl"
MEMBERS = {"ann": "free", "bo": "pro", "cy": "max", "dee": "free", "eve": "pro", "fay": "max"}


def crowd(*jobs, **options) -> Trace:
    """A tiny trace with six members, so that slots are not held back by
    one member's running limit."""
    return replace(trace(*jobs, **options), members=dict(MEMBERS))


def on_one_gpu(tr: Trace, parallel: dict[str, int] | None) -> Run:
    policy = GpuschedOnGpus(running_limits={n: t.max_running_jobs for n, t in tr.tiers.items()})
    return simulate_on_gpus(tr, policy, gpu_specs(1), parallel=parallel)


def in_flight_at(dispatches: list[Dispatch], moment: float) -> list[Dispatch]:
    return [d for d in dispatches if d.started_at <= moment < d.finished_at]


def assert_slots_hold(run: Run, parallel: dict[str, int]) -> None:
    """On every GPU: jobs of two models never overlap, no model runs more
    jobs than its slots, and each job's record says what shared the GPU."""
    for name in run.gpus:
        mine = [d for d in run.dispatches if d.gpu == name]
        for k, dispatch in enumerate(mine):
            beside = [d for d in mine[:k] if d.finished_at > dispatch.started_at]
            assert {d.job.model for d in beside} <= {dispatch.job.model}, dispatch.job.job.id
            assert dispatch.in_flight == len(beside) + 1
            assert dispatch.in_flight <= parallel.get(dispatch.job.model, 1)
            assert dispatch.slot not in {d.slot for d in beside}
            assert 0 <= dispatch.slot < parallel.get(dispatch.job.model, 1)
            assert not (beside and dispatch.swapped)


def fingerprint(run: Run) -> list[tuple]:
    return [
        (d.job.job.id, d.job.job_id, d.started_at, d.finished_at, d.swapped, d.changed_by)
        for d in run.dispatches
    ]


# -- slots --------------------------------------------------------------------------------------


def test_parallel_4_runs_up_to_four_chats_at_once_each_slowed_by_its_company():
    members = list(MEMBERS)
    chats = [
        job(f"c{n}", member=members[n], model="chat", seconds=10.0, priority="normal")
        for n in range(6)
    ]
    run = on_one_gpu(crowd(*chats, initial_model="chat"), {"chat": 4})
    first_four = run.dispatches[:4]
    assert [d.started_at for d in first_four] == [0.0] * 4
    assert [d.in_flight for d in first_four] == [1, 2, 3, 4]
    assert [d.slot for d in first_four] == [0, 1, 2, 3]
    assert [d.finished_at - d.started_at for d in first_four] == [
        batched_seconds(10.0, n) for n in (1, 2, 3, 4)
    ]
    # The fifth and sixth wait for slots: the first one frees at 10 s.
    fifth = run.dispatches[4]
    assert fifth.started_at == 10.0 and fifth.slot == 0 and fifth.in_flight == 4
    assert max(len(in_flight_at(run.dispatches, d.started_at)) for d in run.dispatches) == 4
    assert not any(d.swapped for d in run.dispatches)
    assert_slots_hold(run, {"chat": 4})


def test_a_job_that_joins_a_model_still_loading_waits_out_the_load():
    chats = [job(f"c{n}", member=m, model="chat", seconds=10.0) for n, m in enumerate(MEMBERS)]
    run = on_one_gpu(crowd(*chats[:2], swap_seconds=5.0), {"chat": 2})
    swapping, joining = run.dispatches
    assert swapping.swapped and swapping.finished_at == 5.0 + 10.0
    assert not joining.swapped and joining.finished_at == 5.0 + batched_seconds(10.0, 2)
    assert run.drains == []


def test_a_members_running_limit_counts_gpus_held_so_their_jobs_share_one():
    mine = [job(f"c{n}", member="ann", model="chat", seconds=10.0) for n in range(3)]
    tr = crowd(*mine, initial_model="chat")
    shared = on_one_gpu(tr, {"chat": 4})
    assert [d.started_at for d in shared.dispatches] == [0.0] * 3
    assert [d.in_flight for d in shared.dispatches] == [1, 2, 3]


def test_the_drain_rule_a_higher_band_job_of_another_model_stops_new_slots():
    members = list(MEMBERS)
    chats = [
        job(f"chat{n}", member=members[n], model="chat", seconds=10.0, priority="normal")
        for n in range(3)
    ]
    image = job("image", at=1.0, member="dee", model="image", seconds=20.0, priority="interactive")
    late = job("late-chat", at=2.0, member="eve", model="chat", seconds=10.0, priority="normal")
    tr = crowd(*chats, image, late, initial_model="chat", swap_seconds=5.0)
    run = on_one_gpu(tr, {"chat": 4})
    starts = {d.job.job.id: d for d in run.dispatches}
    # A slot was free at 1 s; the image won it, so the GPU drained instead.
    (drain,) = run.drains
    assert (drain.at, drain.chosen.job.id, drain.in_flight) == (1.0, "image", 3)
    # The late chat did not take the free slot: it waits for the image.
    chats_end = max(starts[f"chat{n}"].finished_at for n in range(3))
    assert chats_end == batched_seconds(10.0, 3)
    assert starts["image"].started_at == chats_end and starts["image"].swapped
    assert starts["image"].finished_at == chats_end + 5.0 + 20.0
    assert starts["late-chat"].started_at == starts["image"].finished_at
    assert starts["late-chat"].swapped
    assert_slots_hold(run, {"chat": 4})
    assert undone_drains(run) == 0


def test_a_drain_is_decided_again_and_a_better_chat_arriving_takes_the_slot():
    """As each live claim decides afresh: a chat of a higher band than the
    image drained for takes the free slot; the image still waits for an
    empty GPU."""
    members = list(MEMBERS)
    chats = [
        job(f"chat{n}", member=members[n], model="chat", seconds=10.0, priority="batch")
        for n in range(3)
    ]
    image = job("image", at=1.0, member="dee", model="image", seconds=20.0, priority="normal")
    urgent = job("urgent", at=2.0, member="eve", model="chat", seconds=10.0, priority="interactive")
    tr = crowd(*chats, image, urgent, initial_model="chat", swap_seconds=5.0)
    run = on_one_gpu(tr, {"chat": 4})
    starts = {d.job.job.id: d for d in run.dispatches}
    first, *again = run.drains
    assert (first.at, first.chosen.job.id) == (1.0, "image")
    assert starts["urgent"].started_at == 2.0 and starts["urgent"].in_flight == 4
    # Once the urgent chat has its slot, the image wins the next free one again.
    assert [drain.chosen.job.id for drain in again] == ["image"]
    assert starts["image"].started_at == starts["urgent"].finished_at
    assert_slots_hold(run, {"chat": 4})


def test_a_stream_of_chats_does_not_hold_a_swap_off_forever():
    """Same band: the image needs ten points of aging to beat the chats'
    affinity; when it does, the GPU drains and swaps, stream or not."""
    members = ["ann", "bo", "cy", "eve", "fay"]
    stream = [
        job(f"chat{n:03d}", at=n * 2.0, member=members[n % 5], model="chat", seconds=3.0)
        for n in range(600)
    ]
    image = job("image", at=5.0, member="dee", model="image", seconds=20.0)
    run = on_one_gpu(crowd(*stream, image, initial_model="chat"), {"chat": 4})
    started = {d.job.job.id: d.started_at for d in run.dispatches}
    assert started["image"] < stream[-1].at
    assert len(run.drains) >= 1
    assert_slots_hold(run, {"chat": 4})


MODELS = {"chat": (1.0, 20.0), "image": (5.0, 60.0), "render": (60.0, 300.0)}


@st.composite
def workloads(draw: st.DrawFn) -> Trace:
    count = draw(st.integers(1, 30))
    jobs = drawn_jobs(draw, count=count, within=200, members=list(MEMBERS), models=MODELS)
    limits = {name: draw(st.integers(1, 3)) for name in ("free", "pro", "max")}
    tiers = {
        name: Tier(bonus, 100, -1000, limits[name])
        for name, bonus in (("free", 0.0), ("pro", 1.0), ("max", 2.0))
    }
    initial = draw(st.sampled_from([None, *sorted(MODELS)]))
    return replace(crowd(*jobs), tiers=tiers, initial_model=initial)


@settings(max_examples=80, deadline=None)
@given(
    workload=workloads(),
    gpus=st.integers(1, 3),
    chat=st.integers(1, 6),
    image=st.integers(1, 3),
    name=st.sampled_from(["gpusched", "fifo-collate", "strict-priority", "round-robin+collate"]),
)
def test_slots_never_mix_models_never_exceed_parallel_and_every_job_runs_once(
    workload, gpus, chat, image, name
):
    parallel = {"chat": chat, "image": image}
    (run,) = compare_on_gpus(workload, gpus, [name], parallel=parallel)
    assert_slots_hold(run, parallel)
    started = [d.job.job.id for d in run.dispatches]
    assert sorted(started) == sorted(j.id for j in workload.jobs)
    assert all(d.started_at >= d.job.submitted_at for d in run.dispatches)
    for dispatch in run.dispatches:
        run_seconds = batched_seconds(dispatch.job.job.seconds, dispatch.in_flight)
        held = dispatch.finished_at - dispatch.started_at
        assert held >= run_seconds - 1e-9
        assert held <= run_seconds + workload.swap_seconds + 1e-9
    if name == "gpusched":
        limits = {tier: spec.max_running_jobs for tier, spec in workload.tiers.items()}
        for k, dispatch in enumerate(run.dispatches):
            # The limit counts GPUs held; the member may share one it holds.
            held = {
                d.gpu
                for d in run.dispatches[:k]
                if d.finished_at > dispatch.started_at and d.job.member_id == dispatch.job.member_id
            }
            # A GPU no other job could use is lent past it (borrowed).
            under_limit = len(held) < limits[dispatch.job.tier]
            assert dispatch.borrowed or dispatch.gpu in held or under_limit


# -- parallel 1 is today's rule ------------------------------------------------------------------


@pytest.mark.parametrize("name", ["chat-heavy", "flood", "live-check"])
def test_parallel_1_gives_todays_run_on_a_committed_trace(name):
    committed = load_trace(TRACES_DIR / f"{name}.jsonl")
    every_model_one = {model: 1 for model in {j.model for j in committed.jobs}}
    for policy in POLICIES:
        (today,) = compare_on_gpus(committed, 1, [policy])
        (ones,) = compare_on_gpus(committed, 1, [policy], parallel=every_model_one)
        assert ones.dispatches == today.dispatches and ones.drains == today.drains == []
        assert fingerprint(ones) == fingerprint(simulate(committed, make_policy(policy, committed)))
        assert {(d.slot, d.in_flight) for d in ones.dispatches} == {(0, 1)}


def test_parallel_1_gives_todays_run_on_several_gpus():
    flood = load_trace(TRACES_DIR / "flood.jsonl")
    for policy in CLUSTER_POLICIES:
        (today,) = compare_on_gpus(flood, 2, [policy])
        (ones,) = compare_on_gpus(flood, 2, [policy], parallel={"image-xl": 1, "chat-small": 1})
        assert ones.dispatches == today.dispatches


# -- the chat-heavy trace ------------------------------------------------------------------------


def test_the_chat_heavy_trace_is_mostly_short_chats_with_images_and_a_few_renders():
    tr = load_trace(CHAT_HEAVY)
    chats = [j for j in tr.jobs if j.kind == "chat"]
    images = [j for j in tr.jobs if j.kind == "image"]
    renders = [j for j in tr.jobs if j.kind == "render"]
    assert len(chats) > 0.85 * len(tr.jobs) and len(images) >= 10 and 1 <= len(renders) <= 6
    assert {j.model for j in chats} == {"chat-small"}
    assert all(2.0 <= j.seconds <= 6.0 for j in chats)
    assert all(20.0 <= j.seconds <= 40.0 for j in images)
    assert {j.priority for j in chats} == {"interactive", "normal"}
    assert {j.priority for j in renders} == {"batch"}
    assert len({j.member for j in chats}) >= 6
    assert tr.duration_seconds == 3600.0 and max(j.at or 0.0 for j in tr.jobs) < 3600.0


def test_slots_shorten_the_chat_waits_and_the_makespan_on_the_chat_heavy_trace():
    comparison = compare_parallel(load_trace(CHAT_HEAVY), CHAT_HEAVY_PARALLEL)
    serial, slots = comparison.serial, comparison.slots
    assert slots.slotted.mean < serial.slotted.mean
    assert slots.slotted.p95 < serial.slotted.p95
    assert slots.makespan < serial.makespan
    assert serial.drains == 0 and slots.drains > 0
    assert slots.summary.most_in_flight == 4
    assert 0 <= slots.drains_undone <= slots.drains


def test_swaps_with_parallel_4_are_no_more_than_with_parallel_1_on_the_chat_heavy_trace():
    """The committed trace (seed 1); over other seeds slots often add a few
    (docs/benchmarks.md, "Parallel slots in the policy simulator")."""
    comparison = compare_parallel(load_trace(CHAT_HEAVY), CHAT_HEAVY_PARALLEL)
    assert comparison.slots.swaps <= comparison.serial.swaps


# -- the option --------------------------------------------------------------------------------


def test_parse_parallel_reads_model_and_slots():
    assert parse_parallel(["chat-small=4", " image-xl = 2 "]) == {"chat-small": 4, "image-xl": 2}
    assert parse_parallel([f"chat-small={MAX_PARALLEL}"]) == {"chat-small": MAX_PARALLEL}


@pytest.mark.parametrize(
    ("texts", "message"),
    [
        (["chat-small"], "bad parallel 'chat-small': expected MODEL=N"),
        (["=4"], "bad parallel '=4'"),
        (["chat-small="], "bad parallel 'chat-small='"),
        (["chat-small=four"], "'four' is not a whole number between 1 and 64"),
        (["chat-small=2.5"], "'2.5' is not a whole number"),
        (["chat-small=0"], "must be between 1 and 64, got 0"),
        ([f"chat-small={MAX_PARALLEL + 1}"], "must be between 1 and 64, got 65"),
        (["chat-small=2", "chat-small=4"], "chat-small is given twice"),
    ],
)
def test_a_bad_parallel_is_refused_with_what_is_wrong(texts, message):
    with pytest.raises(ParallelError, match=message):
        parse_parallel(texts)


def test_the_simulation_refuses_slots_out_of_range():
    with pytest.raises(ParallelError, match="between 1 and 64, got 0"):
        on_one_gpu(crowd(job("a")), {"a": 0})


def run_command(*args: str) -> str:
    out = StringIO()
    call_command("simulate", *args, stdout=out)
    return out.getvalue()


def test_the_command_runs_with_slots_and_says_so_in_its_header():
    output = run_command(str(CHAT_HEAVY), "--parallel", "chat-small=4", "--policy", "gpusched")
    assert output.startswith("trace chat-heavy: 478 jobs over 60.0 min, 9 members, swap 10 s")
    assert "on 1 GPU, serving every model; parallel chat-small=4 (other models 1)" in output
    assert "| drains " in output and "| most in flight " in output
    assert "| gpusched " in output


def test_the_command_compares_parallel_1_with_the_slots_given():
    output = run_command(str(CHAT_HEAVY), "--parallel", "chat-small=4", "--compare-parallel")
    assert "| parallel 1 " in output and "| chat-small=4 " in output
    assert "swaps, chat-heavy trace: no more than with parallel 1: " in output
    assert "gpusched, chat-small=4" in output  # the wait per band and tier


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--parallel", "chat-small=0"], "--parallel: parallel for chat-small must be between 1"),
        (["--parallel", "chat-small=65"], "must be between 1 and 64, got 65"),
        (["--parallel", "chat-small"], "--parallel: bad parallel 'chat-small': expected MODEL=N"),
        (["--parallel", "chat-large=2"], "no job of trace chat-heavy uses chat-large; its models"),
        (["--compare-parallel"], "--compare-parallel needs a model with more than one slot"),
        (
            ["--parallel", "chat-small=4", "--compare-parallel", "--policy", "fifo"],
            "--compare-parallel runs gpusched alone, unreserved; drop --policy",
        ),
    ],
)
def test_bad_parallel_options_are_refused_with_what_is_wrong(args, message):
    with pytest.raises(CommandError, match=message):
        run_command(str(CHAT_HEAVY), *args)
