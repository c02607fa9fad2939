""" "This job is short", not "this model is short": a GPU reserved for jobs
expected under a bound, and the borrowing guard, read each job's own
estimate (its size on its model's learned line), and its model's only
for a job without one."""

import pytest

from queueapp import services
from queueapp.dispatch.claim import ClaimedJob, job_claim_next
from queueapp.locks import DISPATCHER_LOCK_CLASS
from queueapp.models import Gpu, Job
from queueapp.policy.decide import Borrowing
from queueapp.services.run_stats import run_stats_record
from tests import factories

pytestmark = pytest.mark.django_db(transaction=True)

CHAT = "/v1/chat/completions"
SECONDS_PER_TOKEN = 0.1


def writer_job(owner, *, max_tokens: int, priority: str) -> Job:
    body = {**factories.chat_body("writer"), "max_tokens": max_tokens}
    return services.job_submit(
        member=owner, path=CHAT, body=body, model="writer", priority_header=priority
    )


def test_a_gpu_reserved_for_short_jobs_takes_a_short_job_of_a_model_that_is_long_on_average(
    default_tiers, lock_session
):
    gpus = {}
    for name in ("gpu0", "gpu1"):
        row = services.gpu_register(name=name, url=f"http://127.0.0.1:9/{name}")
        services.gpu_state_record(gpu_id=row.pk, reachable=True, resident_model=None)
        lock_session.execute("SELECT pg_advisory_lock(%s, %s)", [DISPATCHER_LOCK_CLASS, row.pk])
        gpus[name] = row
    Gpu.objects.filter(pk=gpus["gpu0"].pk).update(max_expected_seconds=60)
    # The writer's runs: 0.1 s a token, from 10 s to 200 s; its mean is long.
    for tokens in (100, 2000, 400, 2000, 1000, 2000):
        run_stats_record(
            model="writer",
            path=CHAT,
            seconds=tokens * SECONDS_PER_TOKEN,
            swapped=False,
            size=tokens,
        )
    ann, _ = factories.member("ann", "pro")
    long = writer_job(ann, max_tokens=2000, priority="interactive")
    short = writer_job(ann, max_tokens=200, priority="batch")
    assert Job.objects.get(pk=long.pk).expected_p50 > 150
    assert Job.objects.get(pk=short.pk).expected_p50 < 30

    # The long one outranks it (a higher band), but gpu0 keeps it out.
    claimed = job_claim_next(resident_model=None, worker="test-gpu0", gpu=gpus["gpu0"].pk)

    assert isinstance(claimed, ClaimedJob) and claimed.job_id == short.pk
    claimed = job_claim_next(resident_model=None, worker="test-gpu1", gpu=gpus["gpu1"].pk)
    assert isinstance(claimed, ClaimedJob) and claimed.job_id == long.pk


def test_the_borrowing_guard_lends_by_the_jobs_own_estimate_else_its_models():
    guard = Borrowing(max_seconds=60.0, short_models=frozenset({"chat"}))
    short_render = factories.candidate(1, model="render", expected_seconds=20.0)
    long_chat = factories.candidate(2, model="chat", expected_seconds=600.0)
    unknown_chat = factories.candidate(3, model="chat")
    unknown_render = factories.candidate(4, model="render")
    assert guard.lends_to(short_render) and not guard.lends_to(long_chat)
    assert guard.lends_to(unknown_chat) and not guard.lends_to(unknown_render)
