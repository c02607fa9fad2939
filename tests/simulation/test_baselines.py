"""Each policy's order on tiny hand-made traces."""

from dataclasses import replace

import pytest

from queueapp.policy import PolicySettings, play_forward
from queueapp.simulation.baselines import Gpusched, compare, make_policy
from queueapp.simulation.engine import simulate
from tests.simulation.helpers import MEMBERS, job, trace


def order(tr, policy, settings=None):
    return simulate(tr, make_policy(policy, tr, settings)).order


# A long job on model a starts at once; while it runs, b and a requests queue.
INTERLEAVED = trace(
    job("a0", at=0, model="a", seconds=100),
    job("b1", at=1, model="b"),
    job("a2", at=2, model="a"),
    job("b3", at=3, model="b"),
    job("a4", at=4, model="a"),
)


def test_fifo_serves_in_arrival_order_and_swaps_at_every_change():
    run = simulate(INTERLEAVED, make_policy("fifo", INTERLEAVED))
    assert run.order == ["a0", "b1", "a2", "b3", "a4"]
    assert [d.swapped for d in run.dispatches] == [True] * 5


def test_fifo_collate_serves_the_loaded_model_first():
    run = simulate(INTERLEAVED, make_policy("fifo-collate", INTERLEAVED))
    assert run.order == ["a0", "a2", "a4", "b1", "b3"]
    assert sum(d.swapped for d in run.dispatches) == 2


def test_model_priority_orders_swaps_by_the_models_priority():
    tr = trace(
        job("c0", at=0, model="c", seconds=100),
        job("a1", at=1, model="a"),
        job("b2", at=2, model="b"),
        job("a3", at=3, model="a"),
        job("c4", at=4, model="c"),
        model_priority={"b": 5, "a": 1},
    )
    # c is loaded: its request goes first; then b (priority 5), then a's two.
    assert order(tr, "model-priority") == ["c0", "c4", "b2", "a1", "a3"]


def test_strict_priority_orders_by_band_then_arrival_without_tier_or_aging():
    tr = trace(
        job("run", at=0, seconds=100),
        job("batch-old", at=1, priority="batch", member="cy"),
        job("normal-free", at=2, priority="normal"),
        job("normal-max", at=3, priority="normal", member="cy"),
        job("inter", at=4, priority="interactive", model="b"),
        job("capped", at=5, priority="1000000"),  # clamped to 100, later than inter
    )
    assert order(tr, "strict-priority") == [
        "run",
        "inter",
        "capped",
        "normal-free",
        "normal-max",
        "batch-old",
    ]


def test_gpusched_applies_tier_bonus_and_affinity_inside_a_band_but_never_across():
    tr = trace(
        job("run", at=0, model="a", seconds=100, member="bo", priority="batch"),
        job("free-b", at=1, model="b", priority="normal"),
        job("pro-b", at=2, model="b", priority="normal", member="bo"),
        job("free-a", at=3, model="a", priority="normal"),  # affinity +10
        job("max-batch-a", at=4, model="a", priority="batch", member="cy"),  # affinity: -88
    )
    # At t=100 model a is resident: free-a (0 + 10) > pro-b (1) > free-b (0) > batch.
    assert order(tr, "gpusched") == ["run", "free-a", "pro-b", "free-b", "max-batch-a"]


def test_gpusched_lane_clock_lets_a_small_member_in_between_a_flood():
    """S4: ann floods 20 batch jobs; dee (same tier) sends 3 five minutes
    later, which alternate with ann's instead of waiting for all 20."""
    flood = [job(f"ann-{i:02d}", at=0, priority="batch", seconds=60) for i in range(20)]
    late = [job(f"dee-{i}", at=300, member="dee", priority="batch") for i in range(3)]
    tr = replace(trace(*flood, *late), members={**MEMBERS, "dee": "free"})
    gpusched = order(tr, "gpusched")
    fifo = order(tr, "fifo")
    assert [gpusched.index(f"dee-{i}") for i in range(3)] == [6, 8, 10]
    assert [fifo.index(f"dee-{i}") for i in range(3)] == [20, 21, 22]


def test_aging_lets_a_long_waiting_batch_job_pass_interactive_ones():
    """S5: with 1 s per point, a batch job passes fresh interactive jobs after
    200 s more waiting; strict priority never lets it."""
    stream = [job(f"i{n:03d}", at=n * 10.0, priority="interactive", seconds=10) for n in range(60)]
    tr = trace(job("batch", at=0.5, priority="batch", seconds=10), *stream, swap_seconds=0.0)
    aged = order(tr, "gpusched", PolicySettings(aging_divisor=1.0))
    assert 15 < aged.index("batch") < 30
    assert order(tr, "strict-priority").index("batch") == 60


def test_everything_queued_at_once_replays_the_forecast():
    """With no arrival after the first decision, the simulation is the
    dispatcher's forecast (play_forward), job for job and second for second."""
    tr = trace(
        job("1", member="ann", priority="batch", model="a"),
        job("2", member="ann", priority="batch", model="b"),
        job("3", member="bo", priority="batch", model="a"),
        job("4", member="ann", priority="batch", model="a", seconds=20),
        job("5", member="cy", priority="normal", model="b"),
        job("6", member="ann", priority="normal", model="b"),
        job("7", member="bo", priority="batch", model="b", seconds=30),
        dispatch_from=1.0,
    )
    run = simulate(tr, Gpusched())
    assert run.order != [job.id for job in tr.jobs]
    queued = {d.job.job_id: d.job for d in run.dispatches}
    # Candidates as the claim sees them before any dispatch (no lane clock yet).
    fresh = Gpusched()
    forecast = play_forward(
        [fresh.candidate(q) for q in queued.values()],
        now=1.0,
        gpu_free_at=1.0,
        resident_model=None,
        settings=PolicySettings(),
        run_seconds=lambda c: queued[c.job_id].job.seconds,
        swap_seconds=lambda model: tr.swap_seconds,
    )
    assert [f.job_id for f in forecast] == [d.job.job_id for d in run.dispatches]
    assert [f.estimated_start for f in forecast] == pytest.approx(
        [d.started_at for d in run.dispatches]
    )


def test_compare_runs_every_policy_from_an_empty_memory():
    runs = compare(INTERLEAVED)
    assert [run.policy for run in runs] == [
        "fifo",
        "fifo-collate",
        "model-priority",
        "strict-priority",
        "gpusched",
    ]
    assert all(len(run.dispatches) == 5 for run in runs)


def test_unknown_policy_is_named():
    with pytest.raises(KeyError, match="unknown policy 'lifo'; choose from fifo"):
        make_policy("lifo", INTERLEAVED)
