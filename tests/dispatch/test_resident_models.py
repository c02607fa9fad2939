"""The claim with every model llama-swap has ready: a job of any needs no
load, and the heads of each are read (the affinity bonus may lift one above
the best by key)."""

import pytest

from queueapp import services
from queueapp.dispatch.claim import ClaimedJob, job_claim_next
from queueapp.dispatch.lease import job_end_durable
from queueapp.dispatch.snapshot import CANDIDATE_POOL
from queueapp.models import DispatchDecision, Gpu
from queueapp.upstream.client import UpstreamAnswer
from tests import factories

ANSWER = UpstreamAnswer(200, "application/json", b'{"choices": []}', None)

pytestmark = pytest.mark.django_db


def test_a_job_of_any_ready_model_is_claimed_without_a_load(default_tiers):
    gpu = services.gpu_register(name="gpu0", url="http://127.0.0.1:9")
    Gpu.objects.filter(pk=gpu.pk).update(resident_model="a", resident_models=["a", "b"])
    # More heads of "c", each older, than the claim's pool: the "b" head is
    # read only because "b" is ready, and its affinity bonus lifts it above them.
    members = [factories.member(f"m{i}", "free")[0] for i in range(CANDIDATE_POOL + 5)]
    first_c = factories.job(members[0], model="c")
    for member in members[1:]:
        factories.job(member, model="c")
    ready = factories.job(members[-1], model="b")

    # A reading the row does not agree with (llama-swap swapped since): the
    # recorded set tells nothing, and the oldest "c" goes first.
    stale = job_claim_next(resident_model="z", worker="test", gpu=gpu.pk)
    assert isinstance(stale, ClaimedJob)
    assert (stale.job_id, stale.swap_needed) == (first_c.pk, True)
    assert DispatchDecision.objects.get(job_id=first_c.pk).resident_models == []
    job_end_durable(claim=stale, answer=ANSWER, error=None, inline_limit=10_000)

    claim = job_claim_next(resident_model="a", worker="test", gpu=gpu.pk)
    assert isinstance(claim, ClaimedJob)
    assert (claim.job_id, claim.swap_needed) == (ready.pk, False)
    decision = DispatchDecision.objects.get(job_id=ready.pk)
    assert (decision.resident_model, decision.resident_models) == ("a", ["a", "b"])
    assert decision.swap_needed is False
    assert decision.terms["swap_affinity"] == 10.0
