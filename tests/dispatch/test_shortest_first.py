"""Shorter first inside a band (the policy's shortest_first_weight): a job
expected to be short gets up to W points, W / (1 + expected / scale), fixed
at its submission and part of its rank key; never enough to cross a band,
and aging still carries any job past one (queueapp/policy/score.py)."""

from datetime import timedelta

import pytest

from queueapp.dispatch.claim import job_claim_next
from queueapp.models import DispatchDecision, Job, ModelSetting
from queueapp.policy import PolicyInvariantError
from queueapp.services.policy import policy_update, queued_rank_keys_refresh
from tests import factories

pytestmark = pytest.mark.django_db

WEIGHT = 20.0
SCALE = 60.0


def typical_runs(**seconds: float) -> None:
    """Each model's typical run as the operator sets it: its jobs' estimate."""
    for model, typical in seconds.items():
        ModelSetting.objects.create(name=model, typical_seconds=typical)


def long_then_short(default_tiers):
    typical_runs(render=600, quick=5)
    ann, _ = factories.member("ann", "pro")
    bob, _ = factories.member("bob", "pro")
    return factories.job(ann, model="render"), factories.job(bob, model="quick")


def test_a_short_job_queued_after_a_long_one_of_the_same_tier_and_band_starts_first(
    default_tiers,
):
    factories.policy(shortest_first_weight=WEIGHT, shortest_first_scale=SCALE)
    long, short = long_then_short(default_tiers)
    assert Job.objects.get(pk=short.pk).shortness == pytest.approx(WEIGHT / (1 + 5 / SCALE))
    assert Job.objects.get(pk=long.pk).shortness == pytest.approx(WEIGHT / (1 + 600 / SCALE))

    claim = job_claim_next(resident_model=None, worker="test")

    assert claim.job_id == short.pk
    decision = DispatchDecision.objects.get(job_id=short.pk)
    assert decision.terms["shortness"] == pytest.approx(WEIGHT / (1 + 5 / SCALE))
    assert decision.counterfactuals["shortness"] == {"winner": long.pk, "changed": True}


def test_with_the_weight_at_0_the_earlier_job_goes_first(default_tiers):
    factories.policy()
    long, short = long_then_short(default_tiers)
    assert Job.objects.get(pk=short.pk).shortness == 0.0
    claim = job_claim_next(resident_model=None, worker="test")
    assert claim.job_id == long.pk
    assert "shortness" not in DispatchDecision.objects.get(job_id=long.pk).terms


def test_turning_it_on_rekeys_the_queue_already_waiting(default_tiers):
    factories.policy()
    long, short = long_then_short(default_tiers)
    policy_update(changes={"shortest_first_weight": WEIGHT})
    assert Job.objects.get(pk=short.pk).shortness > Job.objects.get(pk=long.pk).shortness > 0
    assert job_claim_next(resident_model=None, worker="test").job_id == short.pk


def test_aging_still_carries_a_batch_job_past_a_short_interactive_one(default_tiers):
    """A batch job (band -100) passes an interactive one (+100) once it has
    aged 200 points more (docs/policy.md); the shortness of the interactive
    one, at most W, adds W / aging points: 20 minutes at 60 s a point."""
    factories.policy(shortest_first_weight=WEIGHT)
    typical_runs(render=600, quick=1)
    ann, _ = factories.member("ann", "pro")
    bob, _ = factories.member("bob", "pro")
    batch = factories.job(ann, model="render", priority="batch")
    interactive = factories.job(bob, model="quick", priority="interactive")
    # Aged 200 points and W more, by the divisor of 60 s a point, and a minute to spare.
    aged = timedelta(seconds=(200 + WEIGHT) * 60 + 60)
    Job.objects.filter(pk=batch.pk).update(
        submitted_at=batch.submitted_at - aged, eligible_at=batch.eligible_at - aged
    )
    queued_rank_keys_refresh(aging_divisor=60.0)
    assert job_claim_next(resident_model=None, worker="test").job_id == batch.pk
    assert Job.objects.get(pk=interactive.pk).status == "queued"


@pytest.mark.parametrize("weight", [88.0, 100.0, -1.0])
def test_a_weight_that_could_cross_a_band_is_refused(default_tiers, weight):
    """With the largest tier bonus (2) and the swap affinity bonus (10), a
    weight of 88 would reach the band spacing of 100."""
    factories.policy()
    with pytest.raises(PolicyInvariantError, match="shortest_first_weight|shortest-first"):
        policy_update(changes={"shortest_first_weight": weight})
    policy_update(changes={"shortest_first_weight": 87.0})
