"""Several GPUs on the virtual clock: the engine's invariants, and one GPU
giving exactly what the one-GPU engine gives."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from queueapp.policy import Candidate, PolicySettings, Reservation
from queueapp.policy.decide import GpuSnapshot
from queueapp.simulation.baselines import POLICIES, make_policy
from queueapp.simulation.cluster import simulate_on_gpus
from queueapp.simulation.cluster_policies import (
    CLUSTER_POLICIES,
    DEFAULT_RESERVATIONS,
    GpuschedOnGpus,
    compare_on_gpus,
)
from queueapp.simulation.engine import Run, simulate
from queueapp.simulation.fleet import (
    ReservationError,
    gpu_specs,
    parse_reservation,
    parse_reservations,
)
from queueapp.simulation.traces import TRACES_DIR, Tier, Trace, load_trace
from queueapp.simulation.traces.generators import GENERATORS
from tests.simulation.helpers import MEMBERS, drawn_jobs, job, trace

# Renders always run a minute or more, chats and images always less: a
# reservation's learned run time puts each model on one side of 60 s.
MODELS = {"chat": (1.0, 50.0), "image": (1.0, 50.0), "render": (60.0, 400.0)}


def _fingerprint(run: Run) -> list[tuple]:
    return [
        (d.job.job.id, d.job.job_id, d.started_at, d.finished_at, d.swapped, d.changed_by)
        for d in run.dispatches
    ]


@st.composite
def workloads(draw: st.DrawFn, *, limits: bool = False) -> Trace:
    """Up to 25 jobs of four members, three bands and three models, arriving
    within a few minutes (so queues form); with `limits`, tiers may let a
    member hold two GPUs."""
    members = {**MEMBERS, "dee": "free"}
    count = draw(st.integers(1, 25))
    jobs = drawn_jobs(draw, count=count, within=300, members=list(members), models=MODELS)
    tiers = {
        name: Tier(bonus, 100, -1000, draw(st.integers(1, 2)) if limits else 1)
        for name, bonus in (("free", 0.0), ("pro", 1.0), ("max", 2.0))
    }
    return replace(trace(*jobs, swap_seconds=5.0), members=members, tiers=tiers)


def _running_at_each_decision(run: Run) -> list[Counter[int]]:
    """Per dispatch (in decision order), each member's jobs running just
    before it: those decided earlier that had not ended by then."""
    counts = []
    for k, dispatch in enumerate(run.dispatches):
        running = Counter(
            earlier.job.member_id
            for earlier in run.dispatches[:k]
            if earlier.finished_at > dispatch.started_at
        )
        counts.append(running)
    return counts


@settings(max_examples=60, deadline=None)
@given(workload=workloads(), gpus=st.integers(1, 4), name=st.sampled_from(list(CLUSTER_POLICIES)))
def test_no_gpu_runs_two_jobs_at_once_and_every_job_runs_once(workload, gpus, name):
    (run,) = compare_on_gpus(workload, gpus, [name])
    by_gpu: dict[str, list] = {}
    for dispatch in run.dispatches:
        by_gpu.setdefault(dispatch.gpu, []).append(dispatch)
    assert set(by_gpu) <= {f"gpu{i}" for i in range(gpus)}
    for dispatches in by_gpu.values():
        dispatches.sort(key=lambda d: d.started_at)
        for before, after in zip(dispatches, dispatches[1:], strict=False):
            assert after.started_at >= before.finished_at
    started = [d.job.job.id for d in run.dispatches]
    assert len(started) == len(set(started))
    assert all(d.started_at >= d.job.submitted_at for d in run.dispatches)
    never = [queued.job.id for queued in run.never_started]
    assert sorted(started + never) == sorted(j.id for j in workload.jobs)
    # Only a reservation on every GPU can leave a job out: one GPU, reserved.
    if name != "gpusched+reserve" or gpus > 1:
        assert never == []


@settings(max_examples=60, deadline=None)
@given(workload=workloads(limits=True), gpus=st.integers(2, 4))
def test_a_strict_member_never_holds_more_gpus_than_the_tier_allows(workload, gpus):
    (run,) = compare_on_gpus(workload, gpus, ["gpusched-strict"])
    limits = {tier: spec.max_running_jobs for tier, spec in workload.tiers.items()}
    for dispatch, running in zip(run.dispatches, _running_at_each_decision(run), strict=True):
        assert running[dispatch.job.member_id] < limits[dispatch.job.tier]
        assert not dispatch.borrowed


@settings(max_examples=60, deadline=None)
@given(workload=workloads(limits=True), gpus=st.integers(2, 4))
def test_a_gpu_is_lent_past_the_limit_only_when_no_other_job_may_take_it(workload, gpus):
    (run,) = compare_on_gpus(workload, gpus, ["gpusched"])
    limits = {tier: spec.max_running_jobs for tier, spec in workload.tiers.items()}
    running_at = _running_at_each_decision(run)
    for k, (dispatch, running) in enumerate(zip(run.dispatches, running_at, strict=True)):
        under_limit = running[dispatch.job.member_id] < limits[dispatch.job.tier]
        assert dispatch.borrowed is not under_limit
        if dispatch.borrowed:
            # Every job that waited then was of a member at the limit.
            waiting = [
                later.job
                for later in run.dispatches[k + 1 :]
                if later.job.submitted_at <= dispatch.started_at
            ]
            assert all(running[q.member_id] >= limits[q.tier] for q in waiting)


@settings(max_examples=60, deadline=None)
@given(workload=workloads(limits=True), gpus=st.integers(2, 4))
def test_no_gpu_stands_idle_while_a_job_waits(workload, gpus):
    """Work conservation: every GPU runs every model and none is reserved,
    so while any job waits, every GPU is busy."""
    (run,) = compare_on_gpus(workload, gpus, ["gpusched"])
    for waiting in run.dispatches:
        start, end = waiting.job.submitted_at, waiting.started_at
        if end <= start:
            continue
        for name in run.gpus:
            busy = sorted(
                (d.started_at, d.finished_at)
                for d in run.dispatches
                if d.gpu == name and d.finished_at > start and d.started_at < end
            )
            cursor = start
            for begin, finish in busy:
                assert begin <= cursor + 1e-9, (name, waiting.job.job.id, cursor, begin)
                cursor = max(cursor, finish)
            assert cursor >= end - 1e-9, (name, waiting.job.job.id, cursor, end)


@settings(max_examples=60, deadline=None)
@given(workload=workloads(limits=True), gpus=st.integers(2, 4))
def test_no_gpu_starts_a_lower_band_while_a_higher_band_job_it_may_take_waits(workload, gpus):
    """With aging too slow to cross a band, neither the ranking nor the
    placement rule lets a GPU start a job while a job of a higher band, whose
    member is under the running limit, waits."""
    slow_aging = PolicySettings(aging_divisor=1e9)
    (run,) = compare_on_gpus(workload, gpus, ["gpusched"], slow_aging)
    limits = {tier: spec.max_running_jobs for tier, spec in workload.tiers.items()}
    order = {d.job.job_id: k for k, d in enumerate(run.dispatches)}
    for k, (dispatch, running) in enumerate(
        zip(run.dispatches, _running_at_each_decision(run), strict=True)
    ):
        waiting = [
            d.job
            for d in run.dispatches
            if d.job.submitted_at <= dispatch.started_at and order[d.job.job_id] > k
        ]
        higher = [
            queued
            for queued in waiting
            if queued.band > dispatch.job.band and running[queued.member_id] < limits[queued.tier]
        ]
        assert higher == [], (dispatch.job.job.id, [q.job.id for q in higher])


@settings(max_examples=60, deadline=None)
@given(workload=workloads(), gpus=st.integers(2, 4))
def test_a_reserved_gpu_never_starts_a_long_job_of_a_lower_band(workload, gpus):
    (run,) = compare_on_gpus(workload, gpus, ["gpusched+reserve"])
    reserved = DEFAULT_RESERVATIONS["gpu0"]
    assert reserved.min_band == 0 and reserved.max_expected_seconds == 60
    on_reserved = [d.job for d in run.dispatches if d.gpu == "gpu0"]
    assert not [q.job.id for q in on_reserved if q.model == "render" and q.band < 0]


@settings(max_examples=40, deadline=None)
@given(workload=workloads())
def test_one_gpu_gives_what_the_one_gpu_engine_gives_on_any_workload(workload):
    for name in POLICIES:
        (run,) = compare_on_gpus(workload, 1, [name])
        assert _fingerprint(run) == _fingerprint(simulate(workload, make_policy(name, workload)))


# The two-GPU day on one GPU is overloaded: collation's queue grows long, so
# only the policy its report compares runs on it here.
ONE_GPU_REPLAYS = [
    (name, policy)
    for name in GENERATORS
    for policy in POLICIES
    if name != "studio-day-2gpu" or policy == "gpusched"
]


@pytest.mark.parametrize(("name", "policy"), ONE_GPU_REPLAYS)
def test_one_gpu_gives_what_the_one_gpu_engine_gives_on_every_committed_trace(name, policy):
    committed = load_trace(TRACES_DIR / f"{name}.jsonl")
    (run,) = compare_on_gpus(committed, 1, [policy])
    assert run.gpus == ("gpu0",) and {d.gpu for d in run.dispatches} == {"gpu0"}
    expected = simulate(committed, make_policy(policy, committed))
    assert _fingerprint(run) == _fingerprint(expected)


def test_more_gpus_start_jobs_side_by_side():
    tr = trace(*(job(f"j{n}", member=member) for n, member in enumerate(MEMBERS)))
    (one,) = compare_on_gpus(tr, 1, ["gpusched"])
    (three,) = compare_on_gpus(tr, 3, ["gpusched"])
    assert [d.started_at for d in one.dispatches] == [0.0, 15.0, 25.0]
    assert [(d.started_at, d.gpu) for d in three.dispatches] == [
        (0.0, "gpu0"),
        (0.0, "gpu1"),
        (0.0, "gpu2"),
    ]


def test_a_reservation_admits_a_band_at_least_min_band_or_a_short_expected_run():
    def admits(reservation: Reservation, *, band: int, expected_seconds: float) -> bool:
        gpu = GpuSnapshot(
            "gpu0",
            min_band=reservation.min_band,
            short_models=reservation.short_models({"m": expected_seconds}),
        )
        job = Candidate(1, band, 0.0, "m", 0.0, 0.0)
        return gpu.keeps_out(job) is None

    both = Reservation(min_band=0, max_expected_seconds=60.0)
    assert admits(both, band=0, expected_seconds=900.0)
    assert admits(both, band=-100, expected_seconds=59.9)
    assert not admits(both, band=-100, expected_seconds=60.0)
    band_only = Reservation(min_band=100)
    assert admits(band_only, band=100, expected_seconds=900.0)
    assert not admits(band_only, band=0, expected_seconds=1.0)
    short_only = Reservation(max_expected_seconds=60.0)
    assert not admits(short_only, band=100, expected_seconds=61.0)
    assert admits(Reservation(), band=-1000, expected_seconds=1e9)


def test_reservations_are_read_from_the_command_line_form():
    assert parse_reservation("gpu0:min_band=0,max_expected_seconds=60") == (
        "gpu0",
        Reservation(min_band=0, max_expected_seconds=60.0),
    )
    assert parse_reservation(" gpu1 : min_band = interactive ") == (
        "gpu1",
        Reservation(min_band=100),
    )
    assert parse_reservations(["gpu0:max_expected_seconds=30"]) == {
        "gpu0": Reservation(max_expected_seconds=30.0)
    }


@pytest.mark.parametrize(
    ("texts", "message"),
    [
        (["min_band=0"], "expected GPU:SETTING=VALUE"),
        (["gpu0:"], "expected GPU:SETTING=VALUE"),
        (["gpu0:min_band"], "'min_band' is not SETTING=VALUE"),
        (["gpu0:band=1"], "unknown reservation setting 'band'"),
        (["gpu0:min_band=high"], "min_band: 'high' is not a whole number"),
        (["gpu0:max_expected_seconds=soon"], "max_expected_seconds: 'soon' is not a number"),
        (["gpu0:max_expected_seconds=-1"], "must be >= 0"),
        (["gpu0:min_band=0,min_band=1"], "min_band is given twice"),
        (["gpu0:min_band=0", "gpu0:min_band=1"], "gpu0 is reserved twice"),
    ],
)
def test_a_bad_reservation_is_refused_with_what_is_wrong(texts, message):
    with pytest.raises(ReservationError, match=message):
        parse_reservations(texts)


def test_a_reservation_must_name_a_simulated_gpu():
    with pytest.raises(ReservationError, match=r"no GPU named gpu2 among the 2 simulated"):
        gpu_specs(2, {"gpu2": Reservation(min_band=0)})


def test_a_lone_reserved_gpu_leaves_what_it_does_not_admit_unstarted():
    tr = trace(
        job("render", priority="batch", model="render", seconds=300),
        job("chat", member="bo", priority="normal", model="chat"),
    )
    policy = GpuschedOnGpus(running_limits={})
    run = simulate_on_gpus(tr, policy, gpu_specs(1, DEFAULT_RESERVATIONS))
    assert run.order == ["chat"]
    assert [queued.job.id for queued in run.never_started] == ["render"]
