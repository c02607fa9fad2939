"""The holder watchdog's sweep (queueapp/services/running_long.py) on the real
database: once per run, its event, the dashboard's flag and the metric."""

import logging
import re
from datetime import timedelta

import pytest
from django.db.models.functions import Now
from django.test import Client

from queueapp import services
from queueapp.dashboard import queue_state
from queueapp.dispatch.claim import ClaimedJob, job_claim_next
from queueapp.dispatch.lease import job_return_to_queue
from queueapp.models import Job, JobEvent, RunStats
from tests import factories

pytestmark = pytest.mark.django_db(transaction=True)
PATH = "/v1/chat/completions"
WATCHDOG = "queueapp.services.running_long"


@pytest.fixture
def running(default_tiers):
    """A chat-a job running on gpu0 (claimed; nothing is sent anywhere)."""
    gpu = services.gpu_register(name="gpu0", url="http://127.0.0.1:9")
    ann, _ = factories.member("ann-member", "pro")
    job = factories.job(ann, model="chat-a")
    claim = job_claim_next(resident_model=None, worker="test", gpu=gpu.pk)
    assert isinstance(claim, ClaimedJob) and claim.job_id == job.pk
    return claim


def held_for(job_id: int, seconds: float) -> None:
    Job.objects.filter(pk=job_id).update(started_at=Now() - timedelta(seconds=seconds))


def metric(name: str, gpu: str = "gpu0") -> float:
    text = Client().get("/metrics").content.decode()
    found = re.search(rf'^{name}{{gpu="{gpu}"}} (\S+)$', text, re.MULTILINE)
    assert found, text
    return float(found.group(1))


def test_a_job_held_past_the_policy_minimum_is_reported_once(running, caplog):
    caplog.set_level(logging.WARNING, logger=WATCHDOG)
    held_for(running.job_id, 9 * 60)  # no estimate learned: 60 s, so the 10 min minimum rules
    assert services.jobs_report_running_long() == []
    assert metric("gpusched_gpu_running_long") == 0
    held_for(running.job_id, 11 * 60)

    (report,) = services.jobs_report_running_long()
    assert services.jobs_report_running_long() == []  # once per run
    lines = [r.getMessage() for r in caplog.records if r.name == WATCHDOG]
    assert lines == [
        f"running long: gpu0 held by job {running.job_id} (member ann-member, model chat-a) "
        "for 11.0 min, past its limit of 10.0 min (3 x its estimate of 1.0 min, or the "
        "policy's minimum)"
    ]
    assert all(r.levelno == logging.WARNING for r in caplog.records if r.name == WATCHDOG)
    (event,) = JobEvent.objects.filter(job_id=running.job_id, kind=JobEvent.Kind.RUNNING_LONG)
    assert event.detail == report.detail()
    assert 660 <= metric("gpusched_gpu_held_seconds") < 700
    assert metric("gpusched_gpu_running_long") == 1
    (entry,) = queue_state()["running_all"]
    assert entry["id"] == running.job_id and entry["running_long"] is True


def test_the_limit_is_three_times_the_learned_estimate_when_that_is_longer(running):
    RunStats.objects.create(model="chat-a", path=PATH, warm_seconds=300, warm_samples=3)
    held_for(running.job_id, 14 * 60)
    assert services.jobs_report_running_long() == []  # 15 min: 3 x 5 min
    held_for(running.job_id, 15 * 60 + 5)
    (report,) = services.jobs_report_running_long()
    assert report.limit_seconds == 900 and report.estimate_seconds == 300


def test_a_lower_policy_minimum_reports_sooner(running):
    RunStats.objects.create(model="chat-a", path=PATH, warm_seconds=0.1, warm_samples=3)
    factories.policy(running_long_min_seconds=1)
    held_for(running.job_id, 2)
    (report,) = services.jobs_report_running_long()
    assert report.limit_seconds == 1


def test_a_run_put_back_in_the_queue_is_watched_afresh_when_it_runs_again(running):
    held_for(running.job_id, 11 * 60)
    assert len(services.jobs_report_running_long()) == 1
    assert job_return_to_queue(claim=running, reason="llama-swap unreachable")
    assert Job.objects.get(pk=running.job_id).running_long_at is None
    claim = job_claim_next(resident_model=None, worker="test", gpu=running.gpu_id)
    assert isinstance(claim, ClaimedJob) and claim.job_id == running.job_id
    assert services.jobs_report_running_long() == []  # a fresh run
    assert metric("gpusched_gpu_running_long") == 0
    held_for(running.job_id, 11 * 60)
    assert len(services.jobs_report_running_long()) == 1


def test_an_idle_gpu_has_held_nothing(default_tiers):
    services.gpu_register(name="gpu0", url="http://127.0.0.1:9")
    assert metric("gpusched_gpu_held_seconds") == 0
    assert metric("gpusched_gpu_running_long") == 0


def test_staff_set_the_policy_minimum_and_a_negative_one_is_refused_naming_it(default_tiers, api):
    _, token = factories.member("op", "max", staff=True)
    client = api.as_member(token)
    assert client.get("/api/policy/").json()["running_long_min_seconds"] == 600
    answer = client.patch("/api/policy/", {"running_long_min_seconds": 1800}, format="json")
    assert answer.status_code == 200 and answer.json()["running_long_min_seconds"] == 1800
    refused = client.patch("/api/policy/", {"running_long_min_seconds": -1}, format="json")
    assert refused.status_code == 400 and "running_long_min_seconds" in refused.content.decode()
