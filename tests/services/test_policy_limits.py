"""Limits the operator sets: the band spacing, a tier's running jobs, a tier's cap and floor."""

import threading

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, transaction

from gpusched.stack import wait_for
from queueapp import services
from queueapp.dispatch.claim import job_claim_next
from queueapp.integrity import queue_lines_violations
from queueapp.models import DispatchDecision, Job, Member, Policy, Tier
from tests import factories
from tests.database import sessions_waiting_on_locks

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff_api(api, default_tiers):
    _, token = factories.member("ops", "free", staff=True)
    return api.as_member(token)


def test_a_band_spacing_above_the_aliases_is_refused_by_the_api(staff_api):
    response = staff_api.patch(
        "/api/policy/", {"band_spacing": 1000, "swap_affinity_bonus": 150}, format="json"
    )
    assert response.status_code == 400
    assert response.json()["detail"] == (
        "band spacing 1000 is larger than the 100 points between the priority aliases "
        "(batch -100, normal 0, interactive 100), so it cannot bound the largest tier bonus "
        "(2, tier max) plus the swap affinity bonus (150) = 152; use a band spacing of at most 100"
    )
    stored = Policy.objects.get(pk=1)
    assert (stored.band_spacing, stored.swap_affinity_bonus) == (100, 10)
    # Alone, too: a spacing wider than the aliases' bounds nothing.
    assert staff_api.patch("/api/policy/", {"band_spacing": 101}, format="json").status_code == 400
    # Narrower is stricter, so accepted while the bonuses fit.
    narrower = staff_api.patch("/api/policy/", {"band_spacing": 50}, format="json")
    assert narrower.status_code == 200 and narrower.json()["band_spacing"] == 50


def test_a_tier_needs_at_least_one_running_job(default_tiers):
    free = Tier.objects.get(name="free")
    free.max_running_jobs = 0
    with pytest.raises(ValidationError, match="must be at least 1"):
        free.full_clean()
    # The database refuses it too, whoever writes it.
    with pytest.raises(IntegrityError), transaction.atomic():
        Tier.objects.filter(pk=free.pk).update(max_running_jobs=0)
    assert Tier.objects.get(pk=free.pk).max_running_jobs == 1


def lower_cap(tier_name, cap):
    tier = Tier.objects.get(name=tier_name)
    tier.priority_cap = cap
    services.tier_save(tier=tier, by="test")


def test_lowering_a_cap_reclamps_a_queued_job_and_the_next_dispatch_follows(default_tiers):
    fay, _ = factories.member("fay", "free")
    pat, _ = factories.member("pat", "pro")
    eager = factories.job(fay, priority="1000", model="m")
    middle = factories.job(pat, priority="75", model="m")
    assert Job.objects.get(pk=eager.pk).priority == 100

    lower_cap("free", 50)

    job = Job.objects.get(pk=eager.pk)
    assert (job.priority_requested, job.priority) == (1000, 50)
    assert job.events.get(kind="reclamped").detail == {
        "priority_requested": 1000,
        "priority_was": 100,
        "priority": 50,
        "tier": "free",
        "by": "test",
    }
    assert queue_lines_violations() == []
    # pro at 75 (+1) now goes before free at 50; before the change free at 100 led.
    claimed = job_claim_next(resident_model="m", worker="test")
    assert claimed.job_id == middle.pk
    assert DispatchDecision.objects.get().candidates[1]["band"] == 50


def test_a_reclamped_job_takes_its_place_in_its_new_queue_line(default_tiers):
    """Lines are (member, band, model); a job that changes band changes line, and
    each line keeps one head, its first job."""
    fay, _ = factories.member("fay", "free")
    early_high = factories.job(fay, priority="1000", model="m")  # band 100, then 50
    at_fifty = factories.job(fay, priority="50", model="m")  # band 50 all along
    late_high = factories.job(fay, priority="90", model="m")  # band 90, then 50
    stays = factories.job(fay, priority="40", model="m")  # under the new cap
    heads_before = set(Job.objects.filter(is_lane_head=True).values_list("pk", flat=True))
    assert heads_before == {early_high.pk, at_fifty.pk, late_high.pk, stays.pk}

    lower_cap("free", 50)

    assert queue_lines_violations() == []
    bands = dict(Job.objects.values_list("pk", "priority"))
    assert [bands[j.pk] for j in (early_high, at_fifty, late_high, stays)] == [50, 50, 50, 40]
    # The band-50 line is now early_high, at_fifty, late_high: early_high leads it.
    heads_after = set(Job.objects.filter(is_lane_head=True).values_list("pk", flat=True))
    assert heads_after == {early_high.pk, stays.pk}
    assert Job.objects.get(pk=stays.pk).events.filter(kind="reclamped").count() == 0
    order = []
    for _ in range(4):
        claimed = job_claim_next(resident_model="m", worker="test")
        order.append(claimed.job_id)
        Job.objects.filter(pk=claimed.job_id).update(status="succeeded")
    assert order == [early_high.pk, at_fifty.pk, late_high.pk, stays.pk]


def test_raising_a_cap_lifts_jobs_that_asked_for_more(default_tiers):
    fay, _ = factories.member("fay", "free")
    job = factories.job(fay, priority="1000", model="m")
    lower_cap("free", 200)
    assert Job.objects.get(pk=job.pk).priority == 200
    # A later save that changes nothing moves nothing.
    lower_cap("free", 200)
    assert Job.objects.get(pk=job.pk).events.filter(kind="reclamped").count() == 1
    assert queue_lines_violations() == []


def test_moving_a_member_to_another_tier_reclamps_its_queued_jobs(default_tiers):
    capped = Tier.objects.create(name="capped", bonus=0, priority_cap=20, priority_floor=-1000)
    fay, _ = factories.member("fay", "free")
    bob, _ = factories.member("bob", "free")
    fays = factories.job(fay, priority="interactive", model="m")
    bobs = factories.job(bob, priority="50", model="m")

    fay.tier = capped
    services.member_save(member=fay, by="test")

    job = Job.objects.get(pk=fays.pk)
    assert (job.priority_requested, job.priority) == (100, 20)
    assert job.events.get(kind="reclamped").detail["tier"] == "capped"
    assert Job.objects.get(pk=bobs.pk).priority == 50  # another member's job stays
    assert queue_lines_violations() == []
    assert job_claim_next(resident_model="m", worker="test").job_id == bobs.pk


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("change", ["tier cap", "member's tier"])
def test_a_submission_during_a_tier_change_waits_and_gets_the_new_clamp(default_tiers, change):
    """Without the tier's FOR SHARE (or the member's lines lock in member_save),
    the submission would finish first with the old cap, after the re-clamp had
    looked for jobs to move, and keep it."""
    fay, _ = factories.member("fay", "free")
    capped = Tier.objects.create(name="capped", bonus=0, priority_cap=20, priority_floor=-1000)
    changing, go_on = threading.Event(), threading.Event()

    def change_tier_and_hold():
        try:
            with transaction.atomic():
                if change == "tier cap":
                    lower_cap("free", 20)
                else:
                    member = Member.objects.get(pk=fay.pk)
                    member.tier = capped
                    services.member_save(member=member, by="test")
                changing.set()
                go_on.wait(timeout=30)
        finally:
            connection.close()

    def submit():
        try:
            submitted.append(factories.job(fay, priority="interactive"))
        finally:
            connection.close()

    submitted = []
    changer = threading.Thread(target=change_tier_and_hold)
    changer.start()
    assert changing.wait(timeout=30)
    submitter = threading.Thread(target=submit)
    submitter.start()
    wait_for(
        lambda: sessions_waiting_on_locks() >= 1,
        message="the submission to wait for the tier change",
    )
    go_on.set()
    changer.join(timeout=30)
    submitter.join(timeout=30)
    [job] = submitted
    assert Job.objects.get(pk=job.pk).priority == 20
    assert queue_lines_violations() == []
