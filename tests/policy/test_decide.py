"""`decide`: every rule about which job a GPU takes, one outcome each."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from queueapp.policy import PolicySettings, rank
from queueapp.policy.decide import (
    Borrowing,
    GpuSnapshot,
    Outcome,
    PeerGpu,
    Skip,
    Snapshot,
    decide,
)
from tests.factories import NOW, candidate

SETTINGS = PolicySettings()


def snapshot(gpu: GpuSnapshot, *heads, **fields) -> Snapshot:
    return Snapshot(now=NOW, gpu=gpu, heads=list(heads), settings=SETTINGS, **fields)


def test_an_idle_gpu_starts_the_best_head_in_slot_0():
    decision = decide(snapshot(GpuSnapshot("gpu0"), candidate(1), candidate(2, band=100)))
    assert decision.outcome is Outcome.START
    assert (decision.chosen.candidate.job_id, decision.slot) == (2, 0)
    assert [entry.candidate.job_id for entry in decision.ranked] == [2, 1]


def test_a_full_gpu_is_full_before_a_paused_dispatch_is_stopped():
    busy = GpuSnapshot("gpu0", slots_taken=frozenset({0}), in_flight_model="a")
    assert decide(snapshot(busy, candidate(1), paused=True)).outcome is Outcome.FULL
    idle = GpuSnapshot("gpu0")
    assert decide(snapshot(idle, candidate(1), paused=True)).outcome is Outcome.STOPPED
    disabled = GpuSnapshot("gpu0", enabled=False)
    assert decide(snapshot(disabled, candidate(1))).outcome is Outcome.STOPPED


def test_each_head_kept_off_the_gpu_carries_its_reason():
    gpu = GpuSnapshot("gpu0", runs_models=frozenset({"a", "b"}), min_band=0)
    decision = decide(
        snapshot(
            gpu,
            candidate(1, model="video"),
            candidate(2, band=-100, model="a"),
            candidate(3, model="b", member=7),
            gpus_held={7: frozenset({"gpu1"})},
            running_limit=lambda member: 1,
        )
    )
    assert decision.outcome is Outcome.NOTHING
    assert decision.skipped == {1: Skip.NOT_SERVED, 2: Skip.RESERVED, 3: Skip.RUNNING_LIMIT}
    assert "running limit" in decision.reason


def test_a_short_model_passes_a_reservation_below_its_band_floor():
    gpu = GpuSnapshot("gpu0", min_band=0, short_models=frozenset({"chat"}))
    decision = decide(snapshot(gpu, candidate(1, band=-100, model="chat")))
    assert decision.outcome is Outcome.START


def test_a_member_at_the_limit_may_share_a_gpu_it_holds():
    gpu = GpuSnapshot("gpu0", slots_taken=frozenset({0}), in_flight_model="a", slots=4)
    decision = decide(
        snapshot(
            gpu,
            candidate(1, model="a", member=7),
            gpus_held={7: frozenset({"gpu0"})},
            running_limit=lambda member: 1,
        )
    )
    assert (decision.outcome, decision.slot) == (Outcome.START, 1)


def test_a_winner_of_another_model_drains_a_shared_gpu():
    gpu = GpuSnapshot("gpu0", slots_taken=frozenset({0}), in_flight_model="a", slots=4)
    decision = decide(snapshot(gpu, candidate(1, model="a"), candidate(2, band=100, model="b")))
    assert decision.outcome is Outcome.DRAIN
    assert decision.chosen.candidate.job_id == 2
    assert decision.slot is None


def test_two_models_in_flight_leave_no_slot():
    gpu = GpuSnapshot("gpu0", slots_taken=frozenset({0, 1}), in_flight_model=None, slots=4)
    assert decide(snapshot(gpu, candidate(1))).outcome is Outcome.FULL


def test_a_leader_loaded_on_another_idle_gpu_is_left_to_it_unless_that_gpu_is_reserved():
    here = GpuSnapshot("gpu0", resident_model="a")
    leader, other = candidate(1, model="b", waited=60), candidate(2, model="a")
    idle = PeerGpu("gpu1", resident_model="b")
    placed = decide(snapshot(here, leader, other, others=[idle]))
    # "a" is loaded here: the affinity bonus alone would make it win, so
    # the leader is the one loaded elsewhere only when it outranks it.
    assert placed.chosen.candidate.job_id == 2
    far_ahead = candidate(1, model="b", waited=3600)
    placed = decide(snapshot(GpuSnapshot("gpu0"), far_ahead, other, others=[idle]))
    assert (placed.chosen.candidate.job_id, placed.placed) == (2, True)
    reserved = PeerGpu("gpu1", resident_model="b", reserved=True)
    kept = decide(snapshot(GpuSnapshot("gpu0"), far_ahead, other, others=[reserved]))
    assert (kept.chosen.candidate.job_id, kept.placed) == (1, False)
    busy = PeerGpu("gpu1", resident_model="b", idle=False)
    kept = decide(snapshot(GpuSnapshot("gpu0"), far_ahead, other, others=[busy]))
    assert kept.chosen.candidate.job_id == 1


def test_a_job_pinned_to_another_gpu_is_kept_off_even_when_no_other_rule_applies():
    pinned = candidate(1, band=100, pinned="gpu1")
    decision = decide(snapshot(GpuSnapshot("gpu0"), pinned, candidate(2)))
    assert decision.chosen.candidate.job_id == 2
    assert decision.skipped == {1: Skip.PINNED}
    alone = decide(snapshot(GpuSnapshot("gpu0"), pinned))
    assert (alone.outcome, alone.reason) == (
        Outcome.NOTHING,
        "no queued job may run here: it may run only on another GPU",
    )
    assert decide(snapshot(GpuSnapshot("gpu1"), pinned)).chosen.candidate.job_id == 1


def test_a_job_pinned_here_is_never_left_to_a_gpu_with_its_model_loaded():
    far_ahead = candidate(1, model="b", waited=3600, pinned="gpu0")
    idle = PeerGpu("gpu1", resident_model="b")
    kept = decide(snapshot(GpuSnapshot("gpu0"), far_ahead, candidate(2), others=[idle]))
    assert (kept.chosen.candidate.job_id, kept.placed) == (1, False)


heads_drawn = st.lists(
    st.builds(
        candidate,
        job_id=st.integers(1, 10_000),
        band=st.sampled_from([-100, 0, 100]),
        tier_bonus=st.sampled_from([0.0, 1.0, 2.0]),
        model=st.sampled_from(["a", "b", "c"]),
        waited=st.floats(0, 20_000),
        member=st.integers(1, 4),
        pinned=st.none() | st.sampled_from(["gpu0", "gpu1"]),
    ),
    max_size=12,
    unique_by=lambda head: head.job_id,
)


@given(
    heads=heads_drawn,
    runs=st.none() | st.frozensets(st.sampled_from(["a", "b", "c"])),
    min_band=st.none() | st.sampled_from([0, 100]),
    held=st.dictionaries(st.integers(1, 4), st.frozensets(st.sampled_from(["gpu0", "gpu1"]))),
    resident=st.none() | st.sampled_from(["a", "b"]),
)
def test_a_started_job_passes_every_rule_and_leads_the_eligible(
    heads, runs, min_band, held, resident
):
    gpu = GpuSnapshot("gpu0", resident_model=resident, runs_models=runs, min_band=min_band)
    decision = decide(
        snapshot(gpu, *heads, gpus_held=held, running_limit=lambda member: 1),
    )
    eligible = [head for head in heads if head.job_id not in decision.skipped]
    if not eligible:
        assert decision.outcome is Outcome.NOTHING
        return
    assert decision.outcome is Outcome.START
    chosen = decision.chosen.candidate
    assert runs is None or chosen.model in runs
    assert min_band is None or chosen.band >= min_band
    assert chosen.pinned_gpu in (None, "gpu0")
    assert "gpu0" in held.get(chosen.member_id, frozenset()) or not held.get(chosen.member_id)
    # No other GPU is idle with a model loaded: no placement, the leader starts.
    best = rank(eligible, now=NOW, resident_model=resident, settings=SETTINGS)[0]
    assert chosen == best.candidate


# -- borrowing: a GPU no other head can use is lent past the running limit -----------------------

AT_LIMIT = {"gpus_held": {7: frozenset({"gpu1"})}, "running_limit": lambda member: 1}


def test_a_gpu_no_other_head_can_use_is_lent_to_a_member_at_the_limit():
    heads = (candidate(1, model="a", member=7), candidate(2, model="video", member=8))
    gpu = GpuSnapshot("gpu0", runs_models=frozenset({"a"}))
    decision = decide(snapshot(gpu, *heads, borrowing=Borrowing(), **AT_LIMIT))
    assert decision.outcome is Outcome.START and decision.borrowed
    assert decision.chosen.candidate.job_id == 1
    assert decision.skipped == {1: Skip.RUNNING_LIMIT, 2: Skip.NOT_SERVED}
    assert "beyond its member's running limit" in decision.reason


def test_an_eligible_head_of_another_member_goes_first_and_nothing_is_borrowed():
    heads = (candidate(1, band=100, member=7), candidate(2, band=-100, member=8))
    decision = decide(snapshot(GpuSnapshot("gpu0"), *heads, borrowing=Borrowing(), **AT_LIMIT))
    assert decision.chosen.candidate.job_id == 2 and not decision.borrowed


def test_a_strict_tier_or_no_borrowing_leaves_the_gpu_idle():
    head = candidate(1, member=7)
    strict = Borrowing(strict_members=frozenset({7}))
    for borrowing in (None, strict):
        decision = decide(snapshot(GpuSnapshot("gpu0"), head, borrowing=borrowing, **AT_LIMIT))
        assert decision.outcome is Outcome.NOTHING and not decision.borrowed
        assert decision.skipped == {1: Skip.RUNNING_LIMIT}


def test_the_guard_keeps_idle_gpus_for_other_members_and_lends_only_short_jobs():
    head = candidate(1, model="render", member=7)
    idle, busy = PeerGpu("gpu2"), PeerGpu("gpu3", idle=False)

    def lent(borrowing: Borrowing, *others: GpuSnapshot) -> bool:
        decision = decide(
            snapshot(GpuSnapshot("gpu0"), head, borrowing=borrowing, others=others, **AT_LIMIT)
        )
        return decision.outcome is Outcome.START

    assert lent(Borrowing(keep_idle=1), idle, busy)
    assert not lent(Borrowing(keep_idle=1), busy)
    assert not lent(Borrowing(keep_idle=2), idle, busy)
    assert not lent(Borrowing(max_seconds=60, short_models=frozenset({"chat"})))
    assert lent(Borrowing(max_seconds=60, short_models=frozenset({"render"})))


def test_a_head_past_its_wait_bound_is_kept_off_and_never_borrows():
    overdue = replace(candidate(1, band=100, member=7), wait_deadline=NOW)
    waiting = replace(candidate(2, band=-100, member=8), wait_deadline=NOW + 60)
    decision = decide(snapshot(GpuSnapshot("gpu0"), overdue, waiting))
    assert decision.chosen.candidate.job_id == 2
    assert decision.skipped == {1: Skip.OVERDUE}
    alone = decide(snapshot(GpuSnapshot("gpu0"), overdue, borrowing=Borrowing(), **AT_LIMIT))
    assert alone.outcome is Outcome.NOTHING and alone.skipped == {1: Skip.OVERDUE}


def test_every_model_llama_swap_has_ready_on_an_idle_gpu_needs_no_load():
    # "b" is ready beside the resident "a" (llama-swap keeps them loaded
    # together): its job has the affinity bonus and wins over an older "c".
    both = GpuSnapshot("gpu0", resident_model="a", resident_models=frozenset({"a", "b"}))
    older, ready = candidate(1, model="c", waited=60), candidate(2, model="b")
    decision = decide(snapshot(both, older, ready))
    assert decision.chosen.candidate.job_id == 2
    assert decision.chosen.terms.swap_affinity == SETTINGS.swap_affinity_bonus
    assert decision.loaded == frozenset({"a", "b"})
    alone = decide(snapshot(GpuSnapshot("gpu0", resident_model="a"), older, ready))
    assert alone.chosen.candidate.job_id == 1
    # With a job in flight only its model may join it: the set does not count.
    busy = replace(both, slots_taken=frozenset({0}), in_flight_model="a", slots=2)
    assert decide(snapshot(busy, ready)).loaded == "a"


def test_a_leader_ready_here_beside_the_resident_model_is_not_left_to_another_gpu():
    here = GpuSnapshot("gpu0", resident_model="a", resident_models=frozenset({"a", "b"}))
    leader, other = candidate(1, model="b", waited=3600), candidate(2, model="a")
    idle = PeerGpu("gpu1", resident_model="b")
    placed = decide(snapshot(here, leader, other, others=[idle]))
    assert (placed.chosen.candidate.job_id, placed.placed) == (1, False)
    # A model ready on another idle GPU beside its resident one is loaded there.
    far_ahead = candidate(1, model="b", waited=3600)
    beside = PeerGpu("gpu1", resident_model="c", resident_models=frozenset({"b", "c"}))
    placed = decide(snapshot(GpuSnapshot("gpu0"), far_ahead, other, others=[beside]))
    assert (placed.chosen.candidate.job_id, placed.placed) == (2, True)
