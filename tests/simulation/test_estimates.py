"""The size-aware estimate against the per-model mean in the replay (estimates.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from queueapp.policy import PolicySettings
from queueapp.policy.request_size import request_size
from queueapp.policy.wait_bound import RunAhead, lucky_start_in, refuses_for_bound
from queueapp.simulation.callers import Callers
from queueapp.simulation.cluster_policies import compare_on_gpus
from queueapp.simulation.estimate_report import compare_estimates, write
from queueapp.simulation.estimates import (
    EXACT,
    MODEL_MEAN,
    SIZE,
    SIZE_P90,
    TODAY,
    RunEstimates,
    eta_errors,
    refusal_counts,
)
from queueapp.simulation.traces import TraceJob, request_body, with_request
from queueapp.simulation.traces.generators import GENERATORS
from queueapp.simulation.traces.sizes import SECONDS_PER_UNIT
from tests.simulation.helpers import job, trace

IMAGE = "/v1/images/generations"


def sized_image(name: str, *, steps: int, at: float, seconds: float, **options) -> TraceJob:
    plain = job(name, at=at, seconds=seconds, model="image-xl", **options)
    return with_request(plain, path=IMAGE, body={"n": 1, "size": "1024x1024", "steps": steps})


def short_and_long(count: int = 12):
    """A GPU busy with images of two sizes, time following size exactly."""
    jobs = []
    for n in range(count):
        steps = 10 if n % 2 else 40
        jobs.append(
            sized_image(f"i{n:02d}", steps=steps, at=n * 5.0, seconds=steps, priority="interactive")
        )
    return trace(*jobs)


def test_a_sized_trace_job_reads_its_size_from_its_body():
    studio = GENERATORS["studio-day-sized"](1)
    for one in studio.jobs[:200]:
        read = request_size(one.path, request_body(one))
        assert read is not None and read.value == pytest.approx(one.size)
        true_seconds = SECONDS_PER_UNIT[one.model] * one.size
        assert 0.3 < one.seconds / true_seconds < 3.0  # sigma 0.2: within five sigma


def test_the_size_line_learns_what_the_mean_cannot():
    learned = RunEstimates()
    short = sized_image("s", steps=10, at=0, seconds=10)
    long = sized_image("l", steps=40, at=0, seconds=40)
    for _ in range(6):
        learned.finished(short, 10.0)
        learned.finished(long, 40.0)
    assert learned.p50(short, SIZE) == pytest.approx(10.0, rel=0.05)
    assert learned.p50(long, SIZE) == pytest.approx(40.0, rel=0.05)
    # The mean lies between the two, for both.
    assert 10.0 < learned.p50(short, MODEL_MEAN) < 40.0
    assert learned.p50(long, EXACT) == 40.0


def test_each_submission_is_forecast_and_the_size_aware_eta_is_closer():
    run = compare_on_gpus(short_and_long(), 1, ["gpusched"], forecasts=True)[0]
    assert len(run.forecasts) == len(run.trace.jobs)
    errors = eta_errors(run)
    assert errors[SIZE].jobs == errors[MODEL_MEAN].jobs == len(run.trace.jobs)
    assert errors[SIZE].mean_abs < errors[MODEL_MEAN].mean_abs
    assert errors[EXACT].mean_abs == pytest.approx(0.0, abs=1e-6)


def test_bounded_jobs_are_judged_by_every_rule_on_the_same_run():
    callers = Callers(max_wait=30.0, bounded_share=1.0)
    run = compare_on_gpus(short_and_long(), 1, ["gpusched"], callers=callers, forecasts=True)[0]
    counts = refusal_counts(run)
    assert counts[TODAY].bounded == counts[SIZE_P90].bounded == len(run.trace.jobs)
    # The p90 rule refuses no more than the size-aware forecast start does.
    assert counts[SIZE_P90].refused <= refusal_counts(run)["size-aware, forecast start"].refused


def test_forecasts_need_gpusched():
    with pytest.raises(ValueError, match="does not forecast"):
        compare_on_gpus(short_and_long(4), 1, ["round-robin+collate"], forecasts=True)


def test_shortness_puts_the_short_job_first_inside_a_band():
    # ann's runs of two sizes teach the line; then, behind ann's long run,
    # cy (max: the larger tier bonus) queues a long job and bo a short one.
    jobs = [
        sized_image(f"warm{n}", steps=steps, at=0.0, seconds=steps)
        for n, steps in enumerate((10, 40, 10, 40))
    ]
    jobs += [
        sized_image("block", steps=40, at=199.0, seconds=40),
        sized_image("long", steps=40, at=200.0, seconds=40, member="cy"),
        sized_image("short", steps=10, at=200.5, seconds=10, member="bo"),
    ]
    tr = trace(*jobs)
    plain = compare_on_gpus(tr, 1, ["gpusched"])[0].order
    weighted = replace(PolicySettings(), shortest_first_weight=20.0)
    shorter = compare_on_gpus(tr, 1, ["gpusched"], weighted)[0].order
    assert plain.index("long") < plain.index("short")
    assert shorter.index("short") < shorter.index("long")


def test_the_lucky_start_takes_the_runs_spread_off():
    ahead = [RunAhead(100.0, 129.0)] * 4  # sigma about 0.2
    lucky = lucky_start_in(start_in=400.0, ahead=ahead)
    assert 300.0 < lucky < 400.0
    assert not refuses_for_bound(start_in=400.0, ahead=ahead, bound=lucky + 1)
    assert refuses_for_bound(start_in=400.0, ahead=ahead, bound=lucky - 1)
    assert refuses_for_bound(start_in=None, ahead=[], bound=60.0)
    # Without a spread the rule is the forecast start's.
    assert lucky_start_in(start_in=50.0, ahead=[RunAhead(50.0, 50.0)]) == 50.0


def test_the_command_report_names_the_three_comparisons():
    comparison = compare_estimates(
        short_and_long(6), callers=Callers(max_wait=30.0), weights=(0.0, 20.0)
    )
    text = write(comparison)
    assert "ETA error" in text and "admission rule" in text and "shortest_first_weight" in text
