"""A job claimed and then refused by llama-swap's key check (401: the key
rotated in llama-swap's config, say) goes back to the queue with its
attempts unchanged, the GPU's row records the refusal, and the dispatcher
backs off instead of claiming it again at once. The dispatcher in this
process, the simulator over real HTTP, real PostgreSQL."""

from __future__ import annotations

import time

import pytest

from gpusched.upstreams import ApiKeys
from queueapp import services
from queueapp.dispatch.claim import ClaimedJob, job_claim_next
from queueapp.dispatch.loop import Dispatcher, Wait
from queueapp.models import Gpu, JobEvent, JobStatus
from queueapp.upstream.client import KEY_REFUSED
from queueapp.upstream.simulator import LlamaSwapSimulator
from tests import factories

pytestmark = pytest.mark.django_db(transaction=True)

KEY = "sk-rotated-away"


@pytest.fixture
def keyed_llama_swap(settings, default_tiers):
    sim = LlamaSwapSimulator(
        "127.0.0.1", 0, {"chat-a": 0.01}, swap_seconds=0, api_keys=["sk-new"]
    ).start()
    settings.LLAMA_SWAP_URL = sim.url
    settings.LLAMA_SWAP_API_KEYS = ApiKeys(for_every_gpu=KEY)
    yield sim
    sim.stop()


def test_a_claimed_job_refused_the_key_goes_back_unfailed_and_the_dispatcher_backs_off(
    keyed_llama_swap,
):
    ann, _ = factories.member("ann", "pro")
    job = factories.job(ann, model="chat-a", label="refused")
    dispatcher = Dispatcher(
        services.gpu_configured(None), deadline=time.monotonic() + 20, wait_when_idle=False
    )
    try:
        # Claimed as if llama-swap had taken the key a moment before.
        claim = job_claim_next(resident_model=None, worker=dispatcher.worker)
        assert isinstance(claim, ClaimedJob) and claim.job_id == job.pk
        first = dispatcher._run(claim)
        second = dispatcher.tick()  # its probe is refused too: a longer pause
    finally:
        dispatcher.close()

    assert isinstance(first, Wait) and isinstance(second, Wait)
    assert 0 < first.seconds < second.seconds
    job.refresh_from_db()
    assert (job.status, job.attempts, job.error) == (JobStatus.QUEUED, 0, "")
    (returned,) = JobEvent.objects.filter(job=job, kind=JobEvent.Kind.RETURNED_TO_QUEUE)
    assert returned.detail["reason"].startswith(f"{KEY_REFUSED} (401 to POST /v1/chat/completions)")
    gpu = Gpu.objects.get()
    assert not gpu.reachable and gpu.error.startswith(f"{KEY_REFUSED} (401 to GET /running)")
    assert KEY not in returned.detail["reason"] + gpu.error
    assert keyed_llama_swap.log() == []
    assert {e["key_matched"] for e in keyed_llama_swap.api_keys.seen()} == {False}
