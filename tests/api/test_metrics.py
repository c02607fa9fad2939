"""GET /metrics: Prometheus text format, figures read from the database."""

from datetime import timedelta

import pytest
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.parser import text_string_to_metric_families

from queueapp import services
from queueapp.dispatch.claim import job_claim_next
from queueapp.dispatch.lease import job_end_durable, jobs_recover_expired
from queueapp.models import Job, JobEvent, JobStatus, OnCallerGone
from queueapp.selectors import db_now
from queueapp.upstream.client import UpstreamAnswer
from tests import factories
from tests.api.helpers import scrape, value

pytestmark = pytest.mark.django_db


def finish(job: Job, *, seconds: float, status: str = JobStatus.SUCCEEDED, ago: float = 10):
    """Mark `job` finished `ago` seconds before now, after running `seconds`."""
    finished = db_now() - timedelta(seconds=ago)
    Job.objects.filter(pk=job.pk).update(
        status=status, started_at=finished - timedelta(seconds=seconds), finished_at=finished
    )


def test_content_type_and_no_authentication(client, default_tiers):
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"] == CONTENT_TYPE_LATEST
    assert client.post("/metrics").status_code == 405


def test_queue_depth_and_oldest_wait_per_band_and_running_jobs(client, default_tiers):
    ann, _ = factories.member("ann", "pro")
    interactive = [factories.job(ann, priority="interactive") for _ in range(3)]
    batch = factories.job(ann, priority="batch")
    Job.objects.filter(pk=batch.pk).update(submitted_at=db_now() - timedelta(seconds=90))
    Job.objects.filter(pk=interactive[0].pk).update(status=JobStatus.RUNNING, started_at=db_now())

    samples = scrape(client)
    assert value(samples, "gpusched_queue_depth", band="100") == 2
    assert value(samples, "gpusched_queue_depth", band="-100") == 1
    assert value(samples, "gpusched_queue_depth", band="0") is None
    assert value(samples, "gpusched_queue_oldest_wait_seconds", band="-100") == pytest.approx(
        90, abs=5
    )
    assert value(samples, "gpusched_queue_oldest_wait_seconds", band="100") == pytest.approx(
        0, abs=5
    )
    assert value(samples, "gpusched_running_jobs") == 1


def test_dispatched_order_changed_and_swaps_count_decisions(client, default_tiers):
    ann, _ = factories.member("ann")
    job = factories.job(ann)
    factories.decision(job, band=0, changed_by_aging=True, swap_needed=True)
    factories.decision(job, band=0, changed_by_aging=True, changed_by_fairness=True)
    factories.decision(job, band=100, changed_by_swap_affinity=True)

    samples = scrape(client)
    assert value(samples, "gpusched_dispatched_total", band="0") == 2
    assert value(samples, "gpusched_dispatched_total", band="100") == 1
    assert value(samples, "gpusched_order_changed_total", term="aging", band="0") == 2
    assert value(samples, "gpusched_order_changed_total", term="fairness", band="0") == 1
    assert value(samples, "gpusched_order_changed_total", term="aging", band="100") == 0
    assert value(samples, "gpusched_order_changed_total", term="swap_affinity", band="100") == 1
    assert value(samples, "gpusched_order_changed_total", term="tier_bonus", band="0") == 0
    assert value(samples, "gpusched_swaps_total") == 1


def test_job_duration_histogram_counts_recent_finished_jobs(client, default_tiers):
    ann, _ = factories.member("ann")
    finish(factories.job(ann), seconds=5)  # on a bucket bound: le is inclusive
    finish(factories.job(ann), seconds=100, status=JobStatus.FAILED)
    finish(factories.job(ann), seconds=2, ago=2 * 86400)  # older than the 24-hour window
    finish(factories.job(ann), seconds=2, status=JobStatus.CANCELLED)
    finish(factories.job(ann, model="chat-large"), seconds=700)

    samples = scrape(client)
    small = {"model": "chat-small"}
    buckets = {
        le: value(samples, "gpusched_job_duration_seconds_bucket", le=le, **small)
        for le in ("1.0", "5.0", "60.0", "120.0", "+Inf")
    }
    assert buckets == {"1.0": 0, "5.0": 1, "60.0": 1, "120.0": 2, "+Inf": 2}
    assert value(samples, "gpusched_job_duration_seconds_count", **small) == 2
    assert value(samples, "gpusched_job_duration_seconds_sum", **small) == pytest.approx(105)
    large = {"model": "chat-large"}
    assert value(samples, "gpusched_job_duration_seconds_bucket", le="600.0", **large) == 0
    assert value(samples, "gpusched_job_duration_seconds_bucket", le="1200.0", **large) == 1


def test_dispatch_gap_histogram_over_recent_decisions(client, default_tiers):
    ann, _ = factories.member("ann")
    job = factories.job(ann)
    for idle in (0.003, 0.04, 12.0, None):
        factories.decision(job, band=0, idle_seconds=idle)
    factories.decision(job, band=0, idle_seconds=0.001, at=db_now() - timedelta(days=2))

    samples = scrape(client)
    bucket = {
        le: value(samples, "gpusched_dispatch_gap_seconds_bucket", le=le)
        for le in ("0.005", "0.05", "5.0", "30.0", "+Inf")
    }
    assert bucket == {"0.005": 1, "0.05": 2, "5.0": 2, "30.0": 3, "+Inf": 3}
    assert value(samples, "gpusched_dispatch_gap_seconds_sum") == pytest.approx(12.043)


def test_upstream_errors_and_returns_count_job_events(client, default_tiers):
    ann, _ = factories.member("ann")
    job = factories.job(ann)
    for kind, cause in [
        ("failed", "upstream"),
        ("failed", "upstream"),
        ("failed", "caller"),
        ("failed", "lease"),
        ("failed", None),
        ("returned_to_queue", None),
        ("succeeded", None),
    ]:
        JobEvent.objects.create(job=job, kind=kind, detail={"cause": cause} if cause else {})

    samples = scrape(client)
    # A caller hanging up or a dead dispatcher is not llama-swap's error.
    assert value(samples, "gpusched_upstream_errors_total") == 2
    failed = {
        cause: value(samples, "gpusched_jobs_failed_total", cause=cause)
        for cause in ("upstream", "caller", "lease", "other")
    }
    assert failed == {"upstream": 2, "caller": 1, "lease": 1, "other": 1}
    assert value(samples, "gpusched_returned_to_queue_total") == 1


@pytest.mark.django_db(transaction=True)
def test_failures_record_whose_they_were(default_tiers):
    ann, _ = factories.member("ann")
    causes = []
    for caller_gone, answer in [
        (None, UpstreamAnswer(500, "application/json", b'{"error": "boom"}', None)),
        (None, None),
        (OnCallerGone.CLOSE, None),
        (OnCallerGone.DRAIN, None),
    ]:
        factories.job(ann)
        claim = job_claim_next(resident_model=None, worker="test")
        job_end_durable(
            claim=claim, answer=answer, error="gone", inline_limit=0, caller_gone=caller_gone
        )
        causes.append(
            JobEvent.objects.filter(job_id=claim.job_id, kind="failed").get().detail["cause"]
        )
    assert causes == ["upstream", "upstream", "caller", "caller"]


def test_upstream_up_and_resident_model_per_gpu(client, default_tiers):
    assert value(scrape(client), "gpusched_upstream_up", gpu="gpu0") is None  # no GPU yet
    gpu0 = services.gpu_register(name="gpu0", url="http://127.0.0.1:9")
    gpu1 = services.gpu_register(name="gpu1", url="http://127.0.0.1:10")
    assert value(scrape(client), "gpusched_upstream_up", gpu="gpu0") is None  # never checked
    assert value(scrape(client), "gpusched_gpu_enabled", gpu="gpu1") == 1
    services.gpu_state_record(gpu_id=gpu0.pk, reachable=True, resident_model="m7")
    services.gpu_state_record(gpu_id=gpu1.pk, reachable=False, resident_model=None, error="down")
    samples = scrape(client)
    assert value(samples, "gpusched_upstream_up", gpu="gpu0") == 1
    assert value(samples, "gpusched_upstream_up", gpu="gpu1") == 0
    assert value(samples, "gpusched_upstream_resident_model_info", gpu="gpu0", model="m7") == 1

    services.gpu_update(
        gpu=gpu1, enabled=False, allowed_models=[], min_band=None, max_expected_seconds=None
    )
    assert value(scrape(client), "gpusched_gpu_enabled", gpu="gpu1") == 0


def test_dispatches_swaps_busy_and_idle_time_per_gpu(client, default_tiers):
    gpu0 = services.gpu_register(name="gpu0", url="http://127.0.0.1:9")
    gpu1 = services.gpu_register(name="gpu1", url="http://127.0.0.1:10")
    ann, _ = factories.member("ann", "pro")
    # One after the other: 30 s ending 40 s ago, then 20 s ending 10 s ago.
    for seconds, ago, gpu, swapped, idle in ((30, 40, gpu0, True, 5.0), (20, 10, gpu0, False, 0.5)):
        job = factories.job(ann)
        finish(job, seconds=seconds, ago=ago)
        Job.objects.filter(pk=job.pk).update(gpu=gpu)
        at = job.submitted_at + timedelta(seconds=3)  # the job waited 3 s for this dispatch
        factories.decision(job, gpu=gpu, swap_needed=swapped, idle_seconds=idle, at=at)
    samples = scrape(client)
    assert value(samples, "gpusched_gpu_dispatched_total", gpu="gpu0") == 2
    assert value(samples, "gpusched_gpu_dispatched_total", gpu="gpu1") == 0
    assert value(samples, "gpusched_gpu_swaps_total", gpu="gpu0") == 1
    assert value(samples, "gpusched_gpu_busy_seconds", gpu="gpu0") == pytest.approx(50, abs=0.1)
    assert value(samples, "gpusched_gpu_busy_seconds", gpu="gpu1") == 0
    # Jobs sharing the GPU's slots overlap: their union counts, once.
    shared = factories.job(ann)
    finish(shared, seconds=20, ago=15)  # within the second job's run
    Job.objects.filter(pk=shared.pk).update(gpu=gpu0)
    busy = value(scrape(client), "gpusched_gpu_busy_seconds", gpu="gpu0")
    assert busy == pytest.approx(55, abs=0.1)  # 5 s more: 35 to 30 s ago
    # Idle before each dispatch, but only while the job it started had been
    # queued: 3 of the first gap's 5 s, all of the second's 0.5 s.
    waited = value(samples, "gpusched_gpu_idle_with_work_seconds", gpu="gpu0")
    assert waited == pytest.approx(3.5)
    assert value(samples, "gpusched_gpu_idle_with_work_seconds", gpu=gpu1.name) == 0


def test_no_member_names_and_a_fixed_number_of_queries(
    client, default_tiers, django_assert_max_num_queries
):
    secret, _ = factories.member("zelda-private-name", "max")
    for i in range(30):
        job = factories.job(secret, priority="interactive" if i % 2 else "batch")
        finish(job, seconds=i)
        factories.decision(job, band=job.priority, idle_seconds=i / 10, changed_by_tier_bonus=True)
        JobEvent.objects.create(job=job, kind="failed")
    factories.job(secret)

    # Eight aggregate queries (the eighth: the models' parallel settings),
    # however many rows: no per-row work at scrape time.
    with django_assert_max_num_queries(8):
        response = client.get("/metrics")
    text = response.content.decode()
    assert "gpusched_dispatched_total" in text
    assert "zelda" not in text
    labels = {
        name
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        for name in sample.labels
    }
    assert labels == {"band", "term", "model", "le", "cause"}  # never a member or a prompt


@pytest.mark.django_db(transaction=True)
def test_an_expired_lease_fails_a_job_as_the_callers_or_the_dispatchers(default_tiers):
    ann, _ = factories.member("ann")
    causes = {}
    for front_door in (True, False):
        job = factories.job(ann)
        Job.objects.filter(pk=job.pk).update(front_door=front_door, attempts=99)
        claim = job_claim_next(resident_model=None, worker="test")
        assert claim.job_id == job.pk
        Job.objects.filter(pk=job.pk).update(lease_expires_at=db_now() - timedelta(seconds=1))
        assert jobs_recover_expired() == [job.pk]
        causes[front_door] = JobEvent.objects.get(job=job, kind="failed").detail["cause"]
    # The caller's connection renews a front-door job's lease; the cluster, any other's.
    assert causes == {True: "caller", False: "lease"}
