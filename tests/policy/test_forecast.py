"""Playing the queue forward: fair share between lanes, start times, swaps."""

import pytest

from queueapp.policy import PolicySettings, play_forward
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
