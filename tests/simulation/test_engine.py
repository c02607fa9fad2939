"""The virtual clock: arrivals, swaps, pauses and chains submitted one at a time."""

from queueapp.simulation.baselines import make_policy
from queueapp.simulation.engine import simulate
from queueapp.upstream.simulator import LlamaSwapSimulator
from tests.simulation.helpers import job, trace


def run(tr, policy="fifo"):
    return simulate(tr, make_policy(policy, tr))


def test_a_swap_is_charged_on_every_model_change_as_the_llama_swap_simulator_does():
    tr = trace(
        job("a1", at=0, model="a", seconds=10),
        job("a2", at=0, model="a", seconds=10),
        job("b1", at=0, model="b", seconds=10),
        swap_seconds=5.0,
    )
    dispatches = run(tr).dispatches
    assert [(d.started_at, d.finished_at, d.swapped) for d in dispatches] == [
        (0.0, 15.0, True),  # nothing resident at the start: a cold load
        (15.0, 25.0, False),
        (25.0, 40.0, True),
    ]
    # The same rule as the HTTP simulator's `_admit` (one flat cold load).
    assert LlamaSwapSimulator(swap_seconds=5.0).swap_seconds == tr.swap_seconds


def test_an_initial_model_is_resident_and_an_idle_gpu_waits_for_the_next_arrival():
    tr = trace(
        job("a1", at=10, model="a", seconds=10),
        job("a2", at=100, model="a", seconds=10),
        initial_model="a",
    )
    dispatches = run(tr).dispatches
    assert [(d.started_at, d.swapped, d.wait) for d in dispatches] == [
        (10.0, False, 0.0),
        (100.0, False, 0.0),
    ]


def test_dispatch_from_holds_the_queue_as_a_paused_dispatcher_does():
    tr = trace(
        job("batch", at=0.0, priority="batch"),
        job("interactive", at=0.5, priority="interactive"),
        dispatch_from=1.0,
    )
    assert run(tr, "gpusched").order == ["interactive", "batch"]
    assert run(trace(*tr.jobs), "gpusched").order == ["batch", "interactive"]


def test_a_chain_unit_is_submitted_after_the_previous_one_finished():
    tr = trace(
        job("shot-1", at=0, model="v", seconds=100, chain="film"),
        job("shot-2", at=None, after="shot-1", delay=3.0, model="v", seconds=100, chain="film"),
        job("other", at=50, model="v", seconds=10),
    )
    dispatches = {d.job.job.id: d for d in run(tr).dispatches}
    assert dispatches["shot-2"].job.submitted_at == 105.0 + 3.0
    # `other` arrived first, so it was queued before shot-2 existed.
    assert run(tr).order == ["shot-1", "other", "shot-2"]
    # Ids follow submission order, as the database's sequence.
    assert [dispatches[name].job.job_id for name in ("shot-1", "other", "shot-2")] == [1, 2, 3]
