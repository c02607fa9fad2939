"""The policies on several GPUs: gpusched's running limit, placement and
reservations, and the balancers in front of llama-swap."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from queueapp.policy import (
    PLACEMENT_LOOKAHEAD,
    Candidate,
    PolicySettings,
    Reservation,
    placed_here,
    rank,
)
from queueapp.simulation.cluster_policies import compare_on_gpus
from queueapp.simulation.engine import Run
from tests.simulation.helpers import job, trace


def where(run: Run) -> dict[str, tuple[str, float]]:
    """Trace id -> (GPU, start)."""
    return {d.job.job.id: (d.gpu, d.started_at) for d in run.dispatches}


# Two GPUs end their first jobs together at t=15 (10 s + a 5 s swap): gpu0
# with model c loaded, gpu1 with model b. Then both are idle at once.
WARM_UP = (
    job("c0", member="cy", priority="interactive", model="c"),  # max: ranks first, on gpu0
    job("b0", member="ann", priority="interactive", model="b"),
)


def test_a_job_whose_model_is_loaded_on_the_other_idle_gpu_is_left_to_it():
    tr = trace(
        *WARM_UP,
        job("b-pro", at=1, member="bo", priority="interactive", model="b"),
        job("a-free", at=2, member="ann", priority="interactive", model="a"),
    )
    (run,) = compare_on_gpus(tr, 2, ["gpusched"])
    placed = where(run)
    # gpu0 ranks b-pro first (pro bonus) but b is loaded on idle gpu1, and
    # a-free, of the same band, can go here: one swap instead of two.
    assert placed["a-free"] == ("gpu0", 15.0)
    assert placed["b-pro"] == ("gpu1", 15.0)
    assert [d.swapped for d in run.dispatches[2:]] == [True, False]
    assert [d.placed for d in run.dispatches] == [False, False, True, False]


def test_placement_never_leaves_a_job_to_another_gpu_for_a_lower_band_one():
    tr = trace(
        *WARM_UP,
        job("b-pro", at=1, member="bo", priority="interactive", model="b"),
        job("a-free", at=2, member="ann", priority="batch", model="a"),
    )
    (run,) = compare_on_gpus(tr, 2, ["gpusched"])
    placed = where(run)
    assert placed["b-pro"] == ("gpu0", 15.0)
    assert placed["a-free"] == ("gpu1", 15.0)
    assert not any(d.placed for d in run.dispatches)


def test_a_job_is_not_left_to_a_gpu_that_has_its_model_loaded_but_is_busy():
    tr = trace(
        job("b-long", member="cy", priority="interactive", model="b", seconds=1000),  # gpu0
        job("c0", member="ann", priority="interactive", model="c"),  # gpu1, ends at 15
        job("b-pro", at=1, member="bo", priority="interactive", model="b"),
        job("a-free", at=2, member="ann", priority="interactive", model="a"),
    )
    (run,) = compare_on_gpus(tr, 2, ["gpusched"])
    placed = where(run)
    assert placed["b-long"] == ("gpu0", 0.0)
    assert placed["b-pro"] == ("gpu1", 15.0)


@settings(max_examples=200, deadline=None)
@given(
    heads=st.lists(
        st.tuples(
            st.sampled_from([-100, 0, 100]),
            st.sampled_from([0.0, 1.0, 2.0]),
            st.sampled_from("abc"),
            st.integers(0, 600),
        ),
        min_size=1,
        max_size=12,
    ),
    resident=st.sampled_from([None, "a", "b", "c"]),
    loaded=st.frozensets(st.sampled_from("abc")),
)
def test_placement_keeps_the_leaders_band_and_moves_only_what_another_gpu_has_loaded(
    heads, resident, loaded
):
    candidates = [
        Candidate(
            job_id=n,
            band=band,
            tier_bonus=bonus,
            model=model,
            submitted_at=float(at),
            eligible_at=float(at),
            member_id=n,
        )
        for n, (band, bonus, model, at) in enumerate(heads, 1)
    ]
    ranked = rank(candidates, now=1000.0, resident_model=resident, settings=PolicySettings())
    chosen = placed_here(ranked, resident_model=resident, loaded_elsewhere=loaded).candidate
    leader = ranked[0].candidate
    assert chosen.band == leader.band
    if chosen is not leader:
        assert leader.model in loaded and leader.model != resident
        assert chosen.model == resident or chosen.model not in loaded
        assert ranked.index(next(r for r in ranked if r.candidate is chosen)) < (
            PLACEMENT_LOOKAHEAD
        )
    elif leader.model in loaded and leader.model != resident:
        # Kept: no job of its band among the first few could go here instead.
        same_band = [
            r.candidate for r in ranked[:PLACEMENT_LOOKAHEAD] if r.candidate.band == leader.band
        ]
        assert all(c.model in loaded and c.model != resident for c in same_band)


def _with_limit(tr, limit: int):
    return replace(
        tr, tiers={name: replace(tier, max_running_jobs=limit) for name, tier in tr.tiers.items()}
    )


def test_a_strict_member_holds_one_gpu_at_a_time_by_default_and_more_when_the_tier_allows():
    tr = trace(*(job(f"ann-{n}", priority="batch", seconds=100) for n in range(3)))
    (one_at_a_time,) = compare_on_gpus(tr, 3, ["gpusched-strict"])
    assert [d.started_at for d in one_at_a_time.dispatches] == [0.0, 105.0, 205.0]
    (two_at_a_time,) = compare_on_gpus(_with_limit(tr, 2), 3, ["gpusched-strict"])
    assert [d.started_at for d in two_at_a_time.dispatches] == [0.0, 0.0, 105.0]


def test_gpus_no_one_else_can_use_are_lent_past_the_running_limit():
    tr = trace(*(job(f"ann-{n}", priority="batch", seconds=100) for n in range(3)))
    (run,) = compare_on_gpus(tr, 3, ["gpusched"])
    assert [d.started_at for d in run.dispatches] == [0.0, 0.0, 0.0]
    assert [d.borrowed for d in run.dispatches] == [False, True, True]


def test_a_running_job_holds_its_members_interactive_job_too_when_strict():
    tr = trace(
        job("ann-render", priority="batch", model="v", seconds=300),
        job("ann-image", at=10, priority="interactive", model="i", seconds=5),
        job("bo-image", at=10, member="bo", priority="interactive", model="i", seconds=5),
    )
    (strict,) = compare_on_gpus(tr, 3, ["gpusched-strict"])
    placed = where(strict)
    assert placed["bo-image"][1] == 10.0
    assert placed["ann-image"][1] == 305.0  # two GPUs idle, but ann holds her one
    (lending,) = compare_on_gpus(tr, 3, ["gpusched"])
    placed = where(lending)
    assert placed["bo-image"][1] == placed["ann-image"][1] == 10.0  # the third GPU is lent


LONG_BATCH = (
    job("render-ann", priority="batch", model="render", seconds=300),
    job("render-bo", member="bo", priority="batch", model="render", seconds=300),
)


def test_a_reserved_gpu_keeps_long_lower_band_jobs_out():
    tr = trace(*LONG_BATCH)
    (unreserved,) = compare_on_gpus(tr, 2, ["gpusched"])
    assert sorted(where(unreserved).values()) == [("gpu0", 0.0), ("gpu1", 0.0)]
    (reserved,) = compare_on_gpus(tr, 2, ["gpusched+reserve"])
    assert sorted(where(reserved).values()) == [("gpu1", 0.0), ("gpu1", 305.0)]


def test_a_reserved_gpu_takes_a_long_job_of_a_band_at_least_its_floor():
    tr = trace(*LONG_BATCH, job("render-cy", member="cy", priority="normal", model="render"))
    (run,) = compare_on_gpus(tr, 2, ["gpusched+reserve"])
    assert where(run)["render-cy"] == ("gpu0", 0.0)


def test_a_model_is_short_for_a_reservation_only_once_one_of_its_runs_finished():
    tr = trace(
        job("chat-ann", priority="batch", model="chat", seconds=10),
        job("chat-bo", member="bo", priority="batch", model="chat", seconds=10),
    )
    short_only = {"gpu0": Reservation(max_expected_seconds=60.0)}
    (run,) = compare_on_gpus(tr, 2, ["gpusched+reserve"], reservations=short_only)
    placed = where(run)
    # Nothing learned at t=0: gpu0 stays idle, gpu1 takes bo's (pro bonus).
    assert placed["chat-bo"] == ("gpu1", 0.0)
    # At 15 a chat run has finished in 10 s: gpu0, first in name order, admits it.
    assert placed["chat-ann"] == ("gpu0", 15.0)


def test_round_robin_assigns_the_nth_arrival_to_gpu_n_mod_n_and_never_moves_it():
    tr = trace(
        job("long", model="a", seconds=1000),
        *(job(f"short-{n}", at=10.0 * n, member="bo", model="a", seconds=5) for n in range(1, 6)),
    )
    (run,) = compare_on_gpus(tr, 2, ["round-robin+collate"])
    placed = where(run)
    assert [placed[f"short-{n}"][0] for n in range(1, 6)] == ["gpu1", "gpu0"] * 2 + ["gpu1"]
    # short-2 waits behind the long job on gpu0 though gpu1 is idle: a
    # balancer's assignment is final.
    assert placed["short-2"][1] == placed["long"][1] + 1005.0
    dispatches = sorted(run.dispatches, key=lambda d: d.job.job_id)
    assert [d.gpu for d in dispatches] == [f"gpu{(d.job.job_id - 1) % 2}" for d in dispatches]


def test_least_busy_assigns_each_arrival_to_the_gpu_with_fewest_queued_and_running():
    tr = trace(
        job("long", model="a", seconds=1000),
        *(job(f"short-{n}", at=10.0 * n, member="bo", model="a", seconds=5) for n in range(1, 6)),
    )
    (run,) = compare_on_gpus(tr, 2, ["least-busy+collate"])
    placed = where(run)
    # gpu0 holds the long job; each short one finds gpu1 empty again.
    assert {placed[f"short-{n}"][0] for n in range(1, 6)} == {"gpu1"}
    assert all(placed[f"short-{n}"][1] == 10.0 * n for n in range(1, 6))


def test_least_busy_counts_queued_jobs_and_takes_the_first_gpu_on_a_tie():
    tr = trace(
        job("a", model="m", seconds=100),
        job("b", at=1, member="bo", model="m", seconds=100),
        job("c", at=2, member="cy", model="m", seconds=100),
        job("d", at=3, model="m", seconds=100),
        job("e", at=4, member="bo", model="m", seconds=100),
    )
    (run,) = compare_on_gpus(tr, 2, ["least-busy+collate"])
    # a: 0/0 -> gpu0; b: 1/0 -> gpu1; c: 1/1 -> gpu0; d: 2/1 -> gpu1; e: 2/2 -> gpu0.
    assert [where(run)[name][0] for name in "abcde"] == ["gpu0", "gpu1", "gpu0", "gpu1", "gpu0"]


def test_each_gpus_llama_swap_collates_its_own_queue():
    tr = trace(
        job("a0", model="a", seconds=100),
        job("f1", at=1, member="bo", model="f"),
        job("b2", at=2, model="b"),
        job("f3", at=3, member="bo", model="f"),
        job("a4", at=4, model="a"),
    )
    (run,) = compare_on_gpus(tr, 2, ["round-robin+collate"])
    # gpu0 is given a0, b2, a4: a4 is for the loaded model, so it skips b2.
    assert [d.job.job.id for d in run.dispatches if d.gpu == "gpu0"] == ["a0", "a4", "b2"]
    assert [d.job.job.id for d in run.dispatches if d.gpu == "gpu1"] == ["f1", "f3"]
