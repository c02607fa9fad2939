"""Queue lines keep one head each, in submission order, through every change."""

import pytest

from queueapp import services
from queueapp.dispatch.claim import job_claim_next
from queueapp.dispatch.lease import job_return_to_queue
from queueapp.models import Job, Lane
from tests import factories
from tests.dispatch.helpers import assert_one_head_per_line

pytestmark = pytest.mark.django_db


def test_submissions_make_one_head_per_member_band_and_model(default_tiers):
    ann, _ = factories.member("ann", "free")
    bob, _ = factories.member("bob", "free")
    first = factories.job(ann, model="a")
    factories.job(ann, model="a")
    other_model = factories.job(ann, model="b")
    other_band = factories.job(ann, model="a", priority="batch")
    other_member = factories.job(bob, model="a")
    heads = set(Job.objects.filter(is_lane_head=True).values_list("id", flat=True))
    assert heads == {first.pk, other_model.pk, other_band.pk, other_member.pk}
    assert_one_head_per_line()


def test_a_dispatch_promotes_the_next_job_and_restarts_the_lane(default_tiers):
    ann, _ = factories.member("ann", "free")
    a1 = factories.job(ann, model="a")
    a2 = factories.job(ann, model="a")
    b1 = factories.job(ann, model="b")
    Job.objects.filter(pk__in=[a1.pk, a2.pk, b1.pk]).update(
        submitted_at=a1.submitted_at.replace(year=2025),
        eligible_at=a1.submitted_at.replace(year=2025),
    )
    claim = job_claim_next(resident_model="a", worker="test")
    assert claim.job_id == a1.pk
    a2, b1 = Job.objects.get(pk=a2.pk), Job.objects.get(pk=b1.pk)
    clock = Lane.objects.get(member=ann, band=0).last_dispatched_at
    assert a2.is_lane_head and a2.eligible_at == clock
    # The member's head of another model in the same band ages from the dispatch too.
    assert b1.eligible_at == clock
    assert_one_head_per_line()


def test_cancelling_a_head_promotes_the_next(default_tiers):
    ann, _ = factories.member("ann", "free")
    a1 = factories.job(ann, model="a")
    a2 = factories.job(ann, model="a")
    services.job_cancel(job=a1, by="ann")
    assert Job.objects.get(pk=a2.pk).is_lane_head
    assert_one_head_per_line()
    chain_units = [
        services.job_submit(
            member=ann,
            path="/v1/chat/completions",
            body={"model": "c"},
            model="c",
            priority_header=None,
            chain={"id": "film", "index": index, "total": 3},
        )
        for index in range(3)
    ]
    assert services.chain_cancel(member=ann, chain_id="film", by="ann") == 3
    assert not Job.objects.filter(pk__in=[j.pk for j in chain_units], is_lane_head=True).exists()
    assert_one_head_per_line()


def test_a_job_returned_to_the_queue_is_its_lines_head_again_with_its_old_key(default_tiers):
    ann, _ = factories.member("ann", "free")
    a1 = factories.job(ann, model="a")
    factories.job(ann, model="a")
    key_before = Job.objects.get(pk=a1.pk).rank_key
    claim = job_claim_next(resident_model=None, worker="test")
    assert job_return_to_queue(claim=claim, reason="llama-swap busy")
    a1 = Job.objects.get(pk=a1.pk)
    assert (a1.status, a1.is_lane_head, a1.rank_key) == ("queued", True, key_before)
    assert_one_head_per_line()


def test_affinity_lets_a_members_later_job_of_the_loaded_model_go_first(default_tiers):
    ann, _ = factories.member("ann", "free")
    factories.job(ann, model="b")
    later_a = factories.job(ann, model="a")
    assert job_claim_next(resident_model="a", worker="test").job_id == later_a.pk
