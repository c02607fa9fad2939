"""Queued jobs' stored estimates set again once the runs learned after their
submission (or the operator's typical run) moved them far
(queueapp/services/expectations.py): the SQL gives what Durations.expected
gives, and the shortness and rank keys follow."""

import pytest
from django_q.models import Schedule

from queueapp import services, tasks
from queueapp.durations import Durations
from queueapp.integrity import queue_lines_violations
from queueapp.models import Job
from queueapp.policy import PolicySettings
from queueapp.policy.request_size import request_size
from queueapp.policy.score import shortness
from queueapp.services.expectations import recently_learned_expectations_refresh as refresh
from queueapp.services.run_stats import run_stats_record
from tests import factories

pytestmark = pytest.mark.django_db

VIDEO = "/v1/images/generations"
WEIGHT = 20.0


def shot(frames: int) -> dict:
    return {"model": "wan", "prompt": "a fox", "num_frames": frames, "steps": 20}


def queue_shots(*frames: int) -> list[Job]:
    ann, _ = factories.member("ann", "pro")
    return [
        services.job_submit(member=ann, path=VIDEO, body=shot(f), model="wan", priority_header=None)
        for f in frames
    ]


def learn(seconds_per_frame: float) -> None:
    for frames in (60, 360, 120, 240, 180, 300):
        size = request_size(VIDEO, shot(frames)).value
        run_stats_record(
            model="wan", path=VIDEO, seconds=frames * seconds_per_frame, swapped=False, size=size
        )


def test_jobs_queued_on_a_guess_get_the_operators_figure_then_the_learned_line(default_tiers):
    factories.policy(shortest_first_weight=WEIGHT)
    jobs = queue_shots(60, 360)
    assert refresh() == 0  # nothing learned, no typical run: unknown stays unknown
    services.model_setting_update(name="wan", changes={"typical_seconds": 300})
    assert [Job.objects.get(pk=j.pk).expected_basis for j in jobs] == ["operator"] * 2

    learn(seconds_per_frame=4.0)
    assert refresh() == 2

    durations, settings = Durations.load(), PolicySettings(shortest_first_weight=WEIGHT)
    for job in Job.objects.filter(pk__in=[j.pk for j in jobs]):
        expected = durations.expected("wan", VIDEO, job.size)
        assert job.expected_basis == "size"
        assert job.expected_p50 == pytest.approx(expected.p50, rel=1e-6)
        assert job.expected_p90 == pytest.approx(expected.p90, rel=1e-6)
        assert job.shortness == pytest.approx(shortness(expected.p50, settings), rel=1e-6)
    assert queue_lines_violations() == []  # the heads' rank keys follow their shortness


def test_an_estimate_that_moved_less_than_a_quarter_is_left(default_tiers):
    learn(seconds_per_frame=4.0)
    (job,) = queue_shots(120)
    stored = Job.objects.get(pk=job.pk).expected_p50
    refresh()
    learn(seconds_per_frame=4.4)  # 10 % slower: within MOVED_FAR
    assert refresh() == 0
    assert Job.objects.get(pk=job.pk).expected_p50 == stored
    learn(seconds_per_frame=8.0)
    learn(seconds_per_frame=8.0)
    assert refresh() == 1
    assert Job.objects.get(pk=job.pk).expected_p50 > 1.5 * stored


def test_the_webhooks_cluster_runs_the_refresh_every_minute(default_tiers, schedules):
    """Once, for every dispatcher, and never on a GPU's worker."""
    schedule = Schedule.objects.get(name="queued-expectations-refresh")
    assert (schedule.func, schedule.schedule_type, schedule.minutes, schedule.cluster) == (
        "queueapp.tasks.refresh_expectations",
        Schedule.MINUTES,
        1,
        "webhooks",
    )
    queue_shots(60)
    learn(seconds_per_frame=4.0)
    assert tasks.refresh_expectations() == "set 1 queued job(s)' estimates again"
