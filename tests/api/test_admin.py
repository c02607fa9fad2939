"""The operator's admin, driven through the Django test client as staff."""

import pytest
from django.contrib.auth import get_user_model

from queueapp.dispatch.claim import job_claim_next
from queueapp.models import DispatchDecision, Job, JobStatus, Policy, Tier
from tests import factories

pytestmark = pytest.mark.django_db


@pytest.fixture
def operator(client, default_tiers):
    user = get_user_model().objects.create_superuser("op", "", "pw-for-tests")
    client.force_login(user)
    return client


def tier_form(tier, **changes):
    data = {
        "name": tier.name,
        "bonus": tier.bonus,
        "priority_cap": tier.priority_cap,
        "priority_floor": tier.priority_floor,
        "max_queued_jobs": tier.max_queued_jobs,
        "max_running_jobs": tier.max_running_jobs,
    }
    return {**data, **changes}


def test_changing_a_tier_bonus_changes_the_next_dispatch(operator):
    free_member, _ = factories.member("fay", "free")
    pro_member, _ = factories.member("pat", "pro")
    factories.job(free_member, priority="batch", model="m")
    factories.job(pro_member, priority="batch", model="m")
    free = Tier.objects.get(name="free")
    response = operator.post(f"/admin/queueapp/tier/{free.pk}/change/", tier_form(free, bonus=3))
    assert response.status_code == 302, response.content.decode()[:2000]
    claimed = job_claim_next(resident_model="m", worker="test")
    assert Job.objects.get(pk=claimed.job_id).member == free_member
    assert DispatchDecision.objects.get().terms["tier_bonus"] == 3


def test_a_tier_bonus_that_breaks_the_invariant_is_refused(operator):
    top = Tier.objects.get(name="max")
    response = operator.post(f"/admin/queueapp/tier/{top.pk}/change/", tier_form(top, bonus=95))
    assert response.status_code == 200
    assert "band spacing 100 must be larger than the largest tier bonus (95, tier max)" in (
        response.content.decode()
    )
    assert Tier.objects.get(name="max").bonus == 2


def test_a_policy_that_breaks_the_invariant_is_refused_with_the_numbers(operator):
    policy = Policy.objects.get(pk=1)
    form = {
        "aging_divisor": 60,
        "swap_affinity_bonus": 99,
        "band_spacing": 100,
        "max_attempts": 3,
        "lease_seconds": 15,
    }
    response = operator.post(f"/admin/queueapp/policy/{policy.pk}/change/", form)
    assert response.status_code == 200
    page = response.content.decode()
    assert "plus the swap affinity bonus (99) = 101" in page
    assert Policy.objects.get(pk=1).swap_affinity_bonus == 10
    response = operator.post(
        f"/admin/queueapp/policy/{policy.pk}/change/", {**form, "swap_affinity_bonus": 5}
    )
    assert response.status_code == 302
    assert Policy.objects.get(pk=1).swap_affinity_bonus == 5


def test_dispatch_decisions_are_read_only(operator):
    owner, _ = factories.member("ann", "free")
    factories.job(owner, model="m")
    job_claim_next(resident_model=None, worker="test")
    decision = DispatchDecision.objects.get()
    assert (
        operator.get(f"/admin/queueapp/dispatchdecision/{decision.pk}/change/").status_code == 200
    )
    assert operator.get("/admin/queueapp/dispatchdecision/add/").status_code == 403
    response = operator.post(
        f"/admin/queueapp/dispatchdecision/{decision.pk}/change/", {"resident_model": "forged"}
    )
    assert response.status_code == 403
    assert (
        operator.post(
            f"/admin/queueapp/dispatchdecision/{decision.pk}/delete/", {"post": "yes"}
        ).status_code
        == 403
    )
    assert DispatchDecision.objects.get().resident_model == ""


def test_job_actions_cancel_and_requeue_through_services(operator):
    owner, _ = factories.member("ann", "free")
    queued = factories.job(owner)
    changelist = "/admin/queueapp/job/"
    operator.post(changelist, {"action": "cancel_jobs", "_selected_action": [queued.pk]})
    assert Job.objects.get(pk=queued.pk).status == JobStatus.CANCELLED
    operator.post(changelist, {"action": "requeue_jobs", "_selected_action": [queued.pk]})
    assert Job.objects.get(pk=queued.pk).status == JobStatus.QUEUED
    kinds = list(Job.objects.get(pk=queued.pk).events.values_list("kind", flat=True))
    assert kinds == ["submitted", "cancelled", "requeued"]


def test_job_list_filters_and_search(operator):
    owner, _ = factories.member("ann", "free")
    factories.job(owner, priority="batch", model="image-xl")
    page = operator.get("/admin/queueapp/job/?status__exact=queued&priority=-100&q=ann")
    assert page.status_code == 200
    assert "image-xl" in page.content.decode()
