"""Playing the queue forward: fair share between lanes, start times, swaps."""

import pytest

from queueapp.policy import ForecastGpu, PolicySettings, play_forward
from queueapp.policy.decide import Borrowing
from tests.factories import NOW, candidate


def forward(candidates, *, run=10.0, swap=0.0, resident="a", **kwargs):
    return play_forward(
        candidates,
        now=NOW,
        gpu_free_at=kwargs.pop("gpu_free_at", NOW),
        resident_model=resident,
        settings=kwargs.pop("settings", PolicySettings()),
        run_seconds=lambda c: run,
        swap_seconds=lambda model: swap,
        **kwargs,
    )


def test_s4_a_late_small_backlog_is_not_stuck_behind_a_big_one():
    """A queued 200 batch shots 10 minutes ago and has been dispatching since
    (its lane clock is its last dispatch, 10 s ago); B queued 5 a second ago."""
    a_jobs = [candidate(i, -100, member=1, waited=600, aged=10) for i in range(1, 141)]
    b_jobs = [candidate(1000 + i, -100, member=2, waited=1) for i in range(5)]
    order = [f.job_id for f in forward(a_jobs + b_jobs)]
    b_positions = [order.index(1000 + i) + 1 for i in range(5)]
    assert max(b_positions) <= 10, b_positions
    # Lanes alternate: A, B, A, B, ...
    assert order[:4] == [1, 1000, 2, 1001]


def test_without_the_lane_clock_b_would_wait_for_all_of_a():
    a_jobs = [candidate(i, -100, member=1, waited=600) for i in range(1, 141)]
    b_jobs = [candidate(1000 + i, -100, member=2) for i in range(5)]
    # Same member id for everyone: one lane, so plain FIFO inside the band.
    same_lane = [
        candidate(c.job_id, -100, member=1, waited=NOW - c.submitted_at) for c in a_jobs + b_jobs
    ]
    order = [f.job_id for f in forward(same_lane)]
    assert order.index(1000) == 140


def test_start_times_add_up_run_and_swap_seconds():
    jobs = [candidate(1, 0, model="a", member=1), candidate(2, 0, model="b", member=1)]
    jobs.append(candidate(3, 0, member=2))
    plan = forward(jobs, run=10, swap=5, gpu_free_at=NOW + 30)
    by_id = {f.job_id: f for f in plan}
    # Job 3 (resident model a, affinity) and job 1 first, then the swap to b.
    assert [f.job_id for f in plan] == [1, 3, 2]
    assert by_id[1].estimated_start == NOW + 30
    assert by_id[3].estimated_start == NOW + 40
    assert by_id[2].estimated_start == NOW + 50
    assert by_id[2].estimated_seconds == 15
    assert [f.position for f in plan] == [1, 2, 3]


@pytest.mark.parametrize(("waited_more", "batch_position"), [(190, 21), (210, 1)])
def test_batch_overtakes_waiting_interactive_jobs_only_past_the_gap(waited_more, batch_position):
    settings = PolicySettings(aging_divisor=1.0)  # 1 point per second; the gap is 200
    batch = candidate(1, -100, member=1, waited=waited_more)
    interactive = [candidate(10 + i, 100, member=2 + i) for i in range(20)]
    plan = forward([batch, *interactive], run=30, settings=settings)
    assert [f.job_id for f in plan].index(1) + 1 == batch_position


def test_stop_after_bounds_the_work():
    jobs = [candidate(i, -100) for i in range(50)]
    assert len(forward(jobs, stop_after=3)) == 3


@pytest.mark.parametrize("count", [0, 1])
def test_empty_and_single(count):
    assert len(forward([candidate(i, -100, member=1) for i in range(count)])) == count


def test_on_two_gpus_a_member_at_their_running_limit_waits_for_their_own_job():
    """Ann (limit 1) has two jobs ahead of Bob's; the second GPU starts Bob's,
    and Ann's second starts when her first ends, on whichever GPU frees."""
    anns = [candidate(1, 100, member=1, waited=20), candidate(2, 100, member=1, waited=19)]
    bobs = [candidate(3, 0, member=2, waited=30)]
    gpus = [ForecastGpu("gpu0", NOW, None), ForecastGpu("gpu1", NOW, None)]
    played = forward(anns + bobs, run=10.0, gpus=gpus, running_limit=lambda member: 1)
    starts = {f.job_id: (f.estimated_start - NOW, f.gpu) for f in played}
    assert starts[1] == (0.0, "gpu0")
    assert starts[3] == (0.0, "gpu1")  # not Ann's second: she is at her limit
    assert starts[2][0] == 10.0
    unlimited = forward(anns + bobs, run=10.0, gpus=gpus)
    assert {f.job_id: f.estimated_start - NOW for f in unlimited}[2] == 0.0


def test_on_two_gpus_a_gpu_no_one_else_can_use_is_lent_as_the_claim_lends_it():
    """Ann's second job borrows gpu1 once Bob's has gone; with a strict
    tier (or the guard) it waits for her first."""
    anns = [candidate(1, 100, member=1, waited=20), candidate(2, 100, member=1, waited=19)]
    bobs = [candidate(3, 0, member=2, waited=30)]
    gpus = [ForecastGpu("gpu0", NOW, None), ForecastGpu("gpu1", NOW, None)]

    def starts(borrowing: Borrowing | None, run: float = 10.0) -> dict[int, float]:
        played = forward(
            anns + bobs, run=run, gpus=gpus, running_limit=lambda member: 1, borrowing=borrowing
        )
        return {f.job_id: f.estimated_start - NOW for f in played}

    assert starts(Borrowing()) == {1: 0.0, 3: 0.0, 2: 10.0}  # gpu1 frees with bob's end
    alone = forward(anns, run=10.0, gpus=gpus, running_limit=lambda m: 1, borrowing=Borrowing())
    assert [(f.job_id, f.estimated_start - NOW, f.gpu) for f in alone] == [
        (1, 0.0, "gpu0"),
        (2, 0.0, "gpu1"),  # lent: no one else waits for it
    ]
    for refused in (Borrowing(strict_members=frozenset({1})), Borrowing(keep_idle=1)):
        held = forward(anns, run=10.0, gpus=gpus, running_limit=lambda m: 1, borrowing=refused)
        assert [f.estimated_start - NOW for f in held] == [0.0, 10.0]


def test_a_running_job_of_the_member_holds_their_next_until_it_ends():
    gpus = [ForecastGpu("gpu0", NOW, None), ForecastGpu("gpu1", NOW + 30, None)]
    played = forward(
        [candidate(1, 100, member=1)],
        gpus=gpus,
        running_limit=lambda member: 1,
        running_until={1: [(NOW + 25, "gpu1")]},  # the member's job on gpu1 ends in 25 s
    )
    assert [(f.estimated_start - NOW, f.gpu) for f in played] == [(25.0, "gpu0")]


def test_a_model_ready_beside_the_resident_one_plays_without_a_load_until_another_loads():
    gpu = ForecastGpu("gpu0", NOW, "a", resident_models=frozenset({"a", "b"}))
    # By score: the older "b" (33 + 10 for affinity), the "c" (16.7), the
    # newer "b" (0 + 10).
    jobs = [candidate(1, model="b", waited=2000), candidate(2, model="c", waited=1000)]
    jobs.append(candidate(3, model="b", waited=1))
    played = forward(jobs, run=10.0, swap=5.0, gpus=[gpu])
    assert [(f.job_id, f.estimated_seconds) for f in played] == [(1, 10.0), (2, 15.0), (3, 15.0)]
    # "b" needed no load; "c" did, and the play keeps only "c" loaded after
    # it, so the last "b" loads again (which of the others llama-swap keeps
    # is its routing's to say).
