"""Playing the queue forward: fair share between lanes, start times, swaps."""

import pytest

from queueapp.policy import Candidate, PolicySettings, play_forward

NOW = 1_800_000_000.0


def job(job_id, member, band=-100, model="a", submitted=NOW, eligible=None, bonus=0.0):
    return Candidate(
        job_id=job_id,
        band=band,
        tier_bonus=bonus,
        model=model,
        submitted_at=submitted,
        eligible_at=submitted if eligible is None else eligible,
        member_id=member,
    )


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
    a_jobs = [job(i, member=1, submitted=NOW - 600, eligible=NOW - 10) for i in range(1, 141)]
    b_jobs = [job(1000 + i, member=2, submitted=NOW - 1) for i in range(5)]
    order = [f.job_id for f in forward(a_jobs + b_jobs)]
    b_positions = [order.index(1000 + i) + 1 for i in range(5)]
    assert max(b_positions) <= 10, b_positions
    # Lanes alternate: A, B, A, B, ...
    assert order[:4] == [1, 1000, 2, 1001]


def test_without_the_lane_clock_b_would_wait_for_all_of_a():
    a_jobs = [job(i, member=1, submitted=NOW - 600) for i in range(1, 141)]
    b_jobs = [job(1000 + i, member=2, submitted=NOW) for i in range(5)]
    # Same member id for everyone: one lane, so plain FIFO inside the band.
    same_lane = [job(c.job_id, member=1, submitted=c.submitted_at) for c in a_jobs + b_jobs]
    order = [f.job_id for f in forward(same_lane)]
    assert order.index(1000) == 140


def test_start_times_add_up_run_and_swap_seconds():
    jobs = [job(1, 1, band=0, model="a"), job(2, 1, band=0, model="b"), job(3, 2, band=0)]
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
    batch = job(1, 1, band=-100, submitted=NOW - waited_more)
    interactive = [job(10 + i, 2 + i, band=100, submitted=NOW) for i in range(20)]
    plan = forward([batch, *interactive], run=30, settings=settings)
    assert [f.job_id for f in plan].index(1) + 1 == batch_position


def test_stop_after_bounds_the_work():
    jobs = [job(i, i) for i in range(50)]
    assert len(forward(jobs, stop_after=3)) == 3


@pytest.mark.parametrize("count", [0, 1])
def test_empty_and_single(count):
    assert len(forward([job(i, 1) for i in range(count)])) == count
