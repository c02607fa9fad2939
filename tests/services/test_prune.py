"""Retention: `manage.py prune_jobs` and the daily prune remove old finished jobs only."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage
from django.core.management import CommandError, call_command
from django_q.models import Schedule

from queueapp import tasks
from queueapp.models import (
    DispatchDecision,
    Job,
    JobEvent,
    JobStatus,
    RunStats,
    WebhookAttempt,
    WebhookDelivery,
)
from queueapp.retention import jobs_prune
from queueapp.selectors import db_now
from tests import factories

pytestmark = pytest.mark.django_db


@pytest.fixture
def owner(default_tiers):
    return factories.member("ada")[0]


def finished(owner, *, days_ago: float, status: str = JobStatus.SUCCEEDED, **fields) -> Job:
    """A job submitted, run and ended `days_ago`, with an audit event and a decision."""
    job = factories.job(owner)
    ended = db_now() - timedelta(days=days_ago)
    Job.objects.filter(pk=job.pk).update(
        status=status,
        is_lane_head=False,
        submitted_at=ended - timedelta(minutes=5),
        started_at=ended - timedelta(minutes=1),
        finished_at=ended,
        **fields,
    )
    factories.decision(job, band=0)
    return job


def with_webhook(job: Job, *, status: str = "delivered") -> WebhookDelivery:
    delivery = WebhookDelivery.objects.create(
        job=job,
        event_type="job.succeeded",
        webhook_id=f"msg_{job.pk}",
        url="https://example.com/hook",
        payload={},
        status=status,
    )
    WebhookAttempt.objects.create(delivery=delivery, status_code=200)
    return delivery


def prune(*args: str) -> str:
    out = StringIO()
    call_command("prune_jobs", *args, stdout=out)
    return out.getvalue()


def test_jobs_past_the_retention_go_and_younger_ones_stay(owner):
    old = finished(owner, days_ago=30, status=JobStatus.FAILED)
    old_enough = finished(owner, days_ago=30 + 1 / 1440, status=JobStatus.CANCELLED)
    young = finished(owner, days_ago=30 - 1 / 1440)
    Job.objects.filter(pk=old.pk).update(finished_at=db_now() - timedelta(days=31))

    output = prune("--older-than", "30d")

    assert set(Job.objects.values_list("pk", flat=True)) == {young.pk}
    assert not Job.objects.filter(pk__in=[old.pk, old_enough.pk]).exists()
    assert output.startswith("deleted 2 finished jobs that ended before ")
    assert "(older than 30d)" in output


def test_queued_and_running_jobs_are_never_touched(owner):
    queued = factories.job(owner)
    running = factories.job(owner, model="other")
    long_ago = db_now() - timedelta(days=400)
    Job.objects.filter(pk=queued.pk).update(submitted_at=long_ago)
    # Even a running job with an (impossible) old finished_at stays.
    Job.objects.filter(pk=running.pk).update(
        status=JobStatus.RUNNING, started_at=long_ago, finished_at=long_ago
    )
    gone = finished(owner, days_ago=400)

    assert "deleted 1 finished jobs" in prune("--older-than", "1h")

    assert set(Job.objects.values_list("pk", flat=True)) == {queued.pk, running.pk}
    assert JobEvent.objects.filter(job=queued).exists()
    assert not Job.objects.filter(pk=gone.pk).exists()


def test_dependent_rows_go_with_their_job_and_aggregates_stay(owner):
    old = finished(owner, days_ago=40)
    with_webhook(old)
    kept = finished(owner, days_ago=1)
    with_webhook(kept)
    RunStats.objects.create(model="chat-small", path="/v1/chat/completions", warm_seconds=2.0)

    output = prune("--older-than", "30d")

    for model in (JobEvent, DispatchDecision, WebhookDelivery):
        assert not model.objects.filter(job_id=old.pk).exists(), model
        assert model.objects.filter(job_id=kept.pk).exists(), model
    assert not WebhookAttempt.objects.filter(delivery__job_id=old.pk).exists()
    assert WebhookAttempt.objects.filter(delivery__job_id=kept.pk).count() == 1
    assert RunStats.objects.count() == 1
    assert (
        "with 1 events, 1 dispatch decisions, 1 webhook deliveries, 1 delivery attempts"
    ) in output


def test_a_dry_run_counts_and_deletes_nothing(owner):
    old = finished(owner, days_ago=40)
    with_webhook(old)
    finished(owner, days_ago=1)

    output = prune("--older-than", "30d", "--dry-run")

    assert output.startswith("would delete 1 finished jobs")
    assert "1 events, 1 dispatch decisions, 1 webhook deliveries, 1 delivery attempts" in output
    assert Job.objects.count() == 2
    assert WebhookAttempt.objects.count() == 1


@pytest.mark.parametrize("bad", ["30", "abc", "-3d", "3y", "d", ""])
def test_a_bad_older_than_is_a_clear_error(owner, bad):
    finished(owner, days_ago=40)
    with pytest.raises(CommandError) as refused:
        prune(f"--older-than={bad}")
    message = str(refused.value)
    assert "--older-than" in message
    assert "e.g. 30d or 12h" in message
    assert Job.objects.count() == 1


@pytest.mark.parametrize("value,age", [("12h", 12 * 3600), ("90m", 5400), ("2w", 14 * 86400)])
def test_units(owner, value, age):
    just_older = finished(owner, days_ago=(age + 60) / 86400)
    just_younger = finished(owner, days_ago=(age - 60) / 86400)
    prune("--older-than", value)
    assert not Job.objects.filter(pk=just_older.pk).exists()
    assert Job.objects.filter(pk=just_younger.pk).exists()


def test_the_default_retention_comes_from_the_setting(owner, settings):
    settings.GPUSCHED_RETENTION_DAYS = 10
    old = finished(owner, days_ago=11)
    young = finished(owner, days_ago=9)
    assert "(older than 10d)" in prune()
    assert list(Job.objects.values_list("pk", flat=True)) == [young.pk]
    assert not Job.objects.filter(pk=old.pk).exists()

    settings.GPUSCHED_RETENTION_DAYS = 0
    with pytest.raises(CommandError, match="pass --older-than"):
        prune()


def test_jobs_something_still_needs_are_kept(owner):
    # A delivery still retrying reads its job; a chain with units to go counts its finished ones.
    retrying = finished(owner, days_ago=40)
    with_webhook(retrying, status="pending")
    unit_done = finished(owner, days_ago=40, chain_id="film")
    unit_next = factories.job(owner)
    Job.objects.filter(pk=unit_next.pk).update(chain_id="film")
    other_chain = finished(owner, days_ago=40, chain_id="done-film")

    prune("--older-than", "30d")

    assert Job.objects.filter(pk__in=[retrying.pk, unit_done.pk, unit_next.pk]).count() == 3
    assert not Job.objects.filter(pk=other_chain.pk).exists()


def test_batches_are_small_transactions_until_none_is_left(owner):
    old = [finished(owner, days_ago=40) for _ in range(5)]
    counts = jobs_prune(finished_before=db_now() - timedelta(days=30), batch_size=2)
    assert (counts.jobs, counts.batches, counts.finished) == (5, 3, True)
    assert not Job.objects.filter(pk__in=[job.pk for job in old]).exists()


def test_a_result_file_is_deleted_after_the_commit(
    owner, settings, tmp_path, django_capture_on_commit_callbacks
):
    settings.MEDIA_ROOT = tmp_path
    old = finished(owner, days_ago=40)
    name = default_storage.save("results/old.png", ContentFile(b"\x89PNG"))
    Job.objects.filter(pk=old.pk).update(result_file=name)

    with django_capture_on_commit_callbacks(execute=True):
        output = prune("--older-than", "30d")

    assert "and 1 result files" in output
    assert not (tmp_path / name).exists()


def test_a_daily_schedule_runs_the_prune_on_the_housekeeping_cluster(schedules):
    schedule = Schedule.objects.get(name="job-retention-prune")
    assert schedule.func == "queueapp.tasks.prune_finished_jobs"
    assert schedule.schedule_type == Schedule.DAILY
    assert schedule.cluster == "webhooks"  # never on the GPU worker


def test_the_scheduled_task_uses_the_retention_setting(owner, settings):
    old = finished(owner, days_ago=31)
    young = finished(owner, days_ago=29)
    settings.GPUSCHED_RETENTION_DAYS = 0
    assert tasks.prune_finished_jobs().startswith("retention off")
    assert Job.objects.filter(pk=old.pk).exists()

    settings.GPUSCHED_RETENTION_DAYS = 30
    assert tasks.prune_finished_jobs() == "pruned 1 finished jobs older than 30 days"
    assert list(Job.objects.values_list("pk", flat=True)) == [young.pk]
