"""The learned line of a model and path (queueapp/policy/size_fit.py), as the
job's end writes it in SQL (queueapp/services/run_stats.py) and the
estimates read it (Durations.expected)."""

import math

import pytest

from queueapp.durations import Durations
from queueapp.models import ModelSetting, RunStats
from queueapp.policy.expected import Basis
from queueapp.policy.size_fit import SizeFitSums
from queueapp.services.run_stats import run_stats_record

VIDEO = "/v1/video/generations"


def sums_of(model: str, path: str = VIDEO) -> SizeFitSums:
    row = RunStats.objects.get(model=model, path=path, concurrency=1)
    return SizeFitSums(row.fit_weight, row.fit_x, row.fit_y, row.fit_xx, row.fit_xy, row.fit_yy)


@pytest.mark.django_db
def test_the_sql_folds_warm_sized_runs_as_the_python_does():
    runs = [(60, 240.0), (360, 1500.0), (120, 470.0), (240, 1010.0)]
    expected = SizeFitSums()
    for size, seconds in runs:
        run_stats_record(model="wan", path=VIDEO, seconds=seconds, swapped=False, size=size)
        expected = expected.with_run(size, seconds)
    got = sums_of("wan")
    for name in ("weight", "x", "y", "xx", "xy", "yy"):
        assert getattr(got, name) == pytest.approx(getattr(expected, name), rel=1e-9), name


@pytest.mark.django_db
def test_a_cold_run_folds_without_its_swap_once_the_swap_is_known():
    # The first run is cold: its swap is not known yet, so it folds nothing.
    run_stats_record(model="wan", path=VIDEO, seconds=300.0, swapped=True, size=60)
    assert sums_of("wan").weight == 0
    run_stats_record(model="wan", path=VIDEO, seconds=240.0, swapped=False, size=60)
    # Cold 300, warm 240: a swap of 60 s. The next cold run of 1500 s ran 1440.
    run_stats_record(model="wan", path=VIDEO, seconds=1500.0, swapped=True, size=360)
    expected = SizeFitSums().with_run(60, 240.0).with_run(360, 1440.0)
    assert sums_of("wan").y == pytest.approx(expected.y)
    assert sums_of("wan").weight == pytest.approx(expected.weight)


@pytest.mark.django_db
def test_runs_beside_others_or_without_a_size_fold_nothing():
    run_stats_record(model="wan", path=VIDEO, seconds=240.0, swapped=False, size=None)
    run_stats_record(model="wan", path=VIDEO, seconds=240.0, swapped=False, size=60, concurrency=2)
    assert sums_of("wan").weight == 0


@pytest.mark.django_db
def test_the_estimate_follows_the_size_once_learned_and_says_on_what_it_rests():
    assert Durations.load().expected("wan", VIDEO, 60).basis is Basis.UNKNOWN
    ModelSetting.objects.create(name="wan", typical_seconds=300)
    operator = Durations.load().expected("wan", VIDEO, 60)
    assert (operator.basis, operator.p50) == (Basis.OPERATOR, 300)
    for frames in (60, 360, 120, 240, 60, 360):
        run_stats_record(model="wan", path=VIDEO, seconds=4.0 * frames, swapped=False, size=frames)
    durations = Durations.load()
    long, short = (durations.expected("wan", VIDEO, frames) for frames in (360, 60))
    assert (long.basis, short.basis) == (Basis.SIZE, Basis.SIZE)
    assert long.p50 / short.p50 == pytest.approx(6.0, rel=0.05)
    assert long.p50 < long.p90
    unsized = durations.expected("wan", VIDEO, None)
    assert unsized.basis is Basis.MODEL and math.isfinite(unsized.p50)
    assert unsized.as_json() == {
        "p50": round(unsized.p50, 3),
        "p90": round(unsized.p90, 3),
        "size": None,
        "basis": "model",
    }
