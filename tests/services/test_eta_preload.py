"""A preload in the estimates: its run is its model's swap, learned from the
loads it made, and it tells nothing of the model's runs; in the forecast it
takes the swap, or nothing when its model is loaded already."""

import pytest

from queueapp import services
from queueapp.durations import Durations
from queueapp.eta import queue_forecast
from queueapp.services.run_stats import run_stats_record
from queueapp.upstream.client import preload_path
from tests import factories

CHAT = "/v1/chat/completions"


@pytest.mark.django_db
def test_a_preload_runs_only_its_swap_learned_from_its_loads():
    run_stats_record(model="image", path=CHAT, seconds=40, swapped=False)
    run_stats_record(model="image", path=preload_path("image"), seconds=12, swapped=True)
    durations = Durations.load()
    assert durations.run_seconds("image", preload_path("image")) == 0.0
    assert durations.swap_seconds("image") == pytest.approx(12.0)
    # The load is no run of the model: the fallbacks ignore it.
    assert durations.run_seconds("image", "/v1/images/generations") == pytest.approx(40.0)
    assert durations.typical_run == pytest.approx(40.0)
    assert durations.models_shorter_than(30) == []


@pytest.mark.django_db
def test_the_forecast_counts_a_preload_as_a_swap(default_tiers):
    factories.policy(dispatch_paused=True)
    run_stats_record(model="chat", path=CHAT, seconds=5, swapped=False)
    run_stats_record(model="image", path=preload_path("image"), seconds=30, swapped=True)
    ann, _ = factories.member("ann", "pro")
    preload = services.job_preload(member=ann, model="image", priority_header="interactive")
    after = factories.job(ann, model="chat", priority="interactive")
    forecast = queue_forecast()
    first, second = forecast.for_job(preload.pk), forecast.for_job(after.pk)
    assert first is not None and second is not None
    assert first.position == 1 and first.estimated_seconds == pytest.approx(30.0)
    assert second.estimated_start - first.estimated_start == pytest.approx(30.0)
