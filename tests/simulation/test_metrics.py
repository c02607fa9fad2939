"""Cobham's bound, Jain's index, percentiles and a run's summary."""

import math
import random

import pytest

from queueapp.simulation.baselines import make_policy
from queueapp.simulation.engine import simulate
from queueapp.simulation.metrics import (
    ServiceClass,
    cobham_bound,
    cobham_wait,
    fair_waits,
    jain_index,
    percentile,
    summarize,
    trace_bound,
)
from queueapp.simulation.traces import TraceJob
from tests.simulation.helpers import job, trace


def test_cobham_on_a_known_case():
    # Class 1: 0.1 jobs/s of exactly 2 s; class 2: 0.05 jobs/s of exactly 10 s.
    # W0 = (0.1 * 4 + 0.05 * 100) / 2 = 2.7; rho1 = 0.2, rho2 = 0.5.
    classes = [ServiceClass(0.1, 2.0, 4.0), ServiceClass(0.05, 10.0, 100.0)]
    assert cobham_wait(classes, 0) == pytest.approx(2.7 / 0.8)  # 3.375 s
    assert cobham_wait(classes, 1) == pytest.approx(2.7 / (0.8 * 0.3))  # 11.25 s
    # From job lists: 10 jobs of 2 s and 5 of 10 s in 100 s are the same classes.
    assert cobham_bound({100: [2.0] * 10, -100: [10.0] * 5}, 100.0) == pytest.approx(3.375)


def test_cobham_is_infinite_when_the_top_class_saturates():
    assert cobham_wait([ServiceClass(1.0, 1.0, 1.0)], 0) == math.inf


def test_a_simulated_m_g_1_with_strict_priority_meets_cobham():
    """The engine and the formula agree: Poisson arrivals, two classes,
    non-preemptive strict priority, 6000 jobs."""
    rng = random.Random(7)
    jobs, t = [], 0.0
    for n in range(6000):
        t += rng.expovariate(0.06)  # total 0.06 jobs/s
        top = rng.random() < 0.5
        seconds = rng.uniform(1.0, 9.0) if top else rng.expovariate(1 / 15.0)
        jobs.append(
            TraceJob(
                id=str(n),
                member="ann",
                priority="interactive" if top else "batch",
                model="a",
                seconds=seconds,
                at=t,
            )
        )
    tr = trace(*jobs, swap_seconds=0.0, duration_seconds=t)
    summary = summarize(simulate(tr, make_policy("strict-priority", tr)))
    assert summary.interactive.mean == pytest.approx(trace_bound(tr), rel=0.1)


def test_jain_index():
    assert jain_index([3.0, 3.0, 3.0]) == pytest.approx(1.0)
    assert jain_index([1.0, 0.0, 0.0]) == pytest.approx(1 / 3)
    assert jain_index([1.0, 2.0]) == pytest.approx(9 / 10)
    assert jain_index([0.0, 0.0]) == 1.0
    assert math.isnan(jain_index([]))


def test_percentile_interpolates_between_ranks():
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 50) == 3.0
    assert percentile(list(range(1, 21)), 95) == pytest.approx(19.05)
    assert math.isnan(percentile([], 95))


def test_fair_wait_does_not_count_the_members_own_backlog():
    tr = trace(
        job("ann-1", at=0, priority="batch", seconds=10),
        job("ann-2", at=0, priority="batch", seconds=10),
        job("bo-1", at=0, member="bo", priority="batch", seconds=10),
        swap_seconds=0.0,
    )
    run = simulate(tr, make_policy("fifo", tr))
    waits = {d.job.job.id: (d.wait, fair) for d, fair in fair_waits(run.dispatches)}
    # ann-2 waited 10 s, but only behind ann's own job: 0 s counted.
    assert waits == {"ann-1": (0.0, 0.0), "ann-2": (10.0, 0.0), "bo-1": (20.0, 20.0)}


def test_summary_of_a_run():
    tr = trace(
        job("run", at=0, priority="batch", seconds=100, chain="film"),
        job("i1", at=10, priority="interactive", model="b", seconds=10, member="bo"),
        job("n1", at=20, priority="normal", seconds=10),
        job("tail", at=None, after="run", delay=1.0, priority="batch", chain="film"),
        swap_seconds=5.0,
    )
    summary = summarize(simulate(tr, make_policy("gpusched", tr)))
    assert summary.top_band == 100 and summary.bottom_band == -100
    assert summary.interactive.mean == pytest.approx(95.0)  # waited for the 105 s render
    assert summary.swaps == 3 and summary.swap_seconds == 15.0
    assert summary.longest_wait_job == "n1"  # behind the render and i1
    film = summary.chains["film"]
    assert (film.units, film.done) == (2, 2)
    assert film.completion_seconds == summary.finished_at
    assert summary.tiers[(100, "pro")].count == 1
    assert summary.tier_order == ["free", "pro", "max"]
