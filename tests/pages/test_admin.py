"""The operator's admin, driven through the Django test client as staff."""

import re

import pytest
from django.contrib.auth import get_user_model

from queueapp import services
from queueapp.dispatch.claim import job_claim_next
from queueapp.integrity import queue_lines_violations
from queueapp.models import (
    DispatchDecision,
    Gpu,
    Job,
    JobStatus,
    Member,
    ModelSetting,
    Policy,
    Tier,
)
from queueapp.policy.routing import routing_parts
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


# The policy's change form as the admin posts it, every required field filled.
POLICY_FORM = {
    "aging_divisor": 60,
    "swap_affinity_bonus": 10,
    "band_spacing": 100,
    "shortest_first_weight": 0,
    "shortest_first_scale": 60,
    "max_attempts": 3,
    "lease_seconds": 15,
    "borrow_keep_idle_gpus": 0,
    "priority_by_path": '{"/v1/audio/speech": 100, "/v1/audio/transcriptions": 100}',
    "running_long_min_seconds": 600,
}


def test_a_policy_that_breaks_the_invariant_is_refused_with_the_numbers(operator):
    policy = Policy.objects.get(pk=1)
    form = {**POLICY_FORM, "swap_affinity_bonus": 99}
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


def listed(operator, query):
    """The ids of the jobs the admin's job list shows for `query`."""
    response = operator.get(f"/admin/queueapp/job/?{query}")
    assert response.status_code == 200, response.content.decode()[:2000]
    return {job.pk for job in response.context["cl"].result_list}


def test_job_list_filters_and_search(operator):
    ann, _ = factories.member("ann", "free")
    bob, _ = factories.member("bob", "pro")
    base = factories.job(ann, model="chat-small")
    batch = factories.job(ann, priority="batch", model="chat-small")
    image = factories.job(ann, model="image-xl")
    other_member = factories.job(bob, model="chat-small")
    done = factories.job(ann, model="chat-small")
    services.job_cancel(job=done, by="test")

    def chained(chain_id):
        return services.job_submit(
            member=ann,
            path="/v1/chat/completions",
            body=factories.chat_body("chat-small"),
            model="chat-small",
            priority_header=None,
            chain={"id": chain_id, "index": 0, "total": 2},
        )

    film = chained("film-a")
    trailer = chained("trailer-b")
    every = {base.pk, batch.pk, image.pk, other_member.pk, done.pk, film.pk, trailer.pk}
    assert listed(operator, "") == every

    assert listed(operator, "status__exact=cancelled") == {done.pk}
    assert listed(operator, "status__exact=queued") == every - {done.pk}
    assert listed(operator, f"member__id__exact={bob.pk}") == {other_member.pk}
    assert listed(operator, f"member__tier__id__exact={bob.tier_id}") == {other_member.pk}
    assert listed(operator, "priority=-100") == {batch.pk}
    assert listed(operator, "model=image-xl") == {image.pk}
    assert listed(operator, "chain=any") == {film.pk, trailer.pk}
    assert listed(operator, "chain=none") == every - {film.pk, trailer.pk}
    assert listed(operator, "chain=id:film-a") == {film.pk}
    # Filters combine: ann's queued chat-small jobs in the normal band, not in a chain.
    assert listed(
        operator,
        f"status__exact=queued&member__id__exact={ann.pk}&priority=0&model=chat-small&chain=none",
    ) == {base.pk}

    # The filter offers each chain by name, the most recent first.
    page = operator.get("/admin/queueapp/job/").content.decode()
    assert page.index("?chain=id%3Atrailer-b") < page.index("?chain=id%3Afilm-a")

    # Search: by exact id, member name, model and chain id (JobAdmin.search_fields);
    # no name above holds a digit, so an id matches nothing else.
    assert listed(operator, f"q={image.pk}") == {image.pk}
    assert listed(operator, "q=bob") == {other_member.pk}
    assert listed(operator, "q=image-xl") == {image.pk}
    assert listed(operator, "q=trailer-b") == {trailer.pk}


def test_the_chain_filter_names_a_bounded_number_of_recent_chains(operator):
    from queueapp.admin import ChainFilter

    ann, _ = factories.member("ann", "free")
    limit = ChainFilter.RECENT_CHAINS
    for index in range(limit + 2):
        services.job_submit(
            member=ann,
            path="/v1/chat/completions",
            body=factories.chat_body("chat-small"),
            model="chat-small",
            priority_header=None,
            chain={"id": f"shot-{index:02d}", "index": 0, "total": 1},
        )
    page = operator.get("/admin/queueapp/job/").content.decode()
    offered = re.findall(r"\?chain=id%3A(shot-\d+)", page)
    assert offered == [f"shot-{index:02d}" for index in range(limit + 1, 1, -1)]
    # An older chain reached by a link is still filtered, and shown as chosen.
    assert len(listed(operator, "chain=id:shot-00")) == 1
    assert (
        "?chain=id%3Ashot-00"
        in operator.get("/admin/queueapp/job/?chain=id:shot-00").content.decode()
    )


def action_message(response):
    return [str(message) for message in response.context["messages"]]


def test_rotating_a_token_in_the_admin_retires_the_old_one(operator, api):
    member, old_token = factories.member("ann", "free")
    assert api.as_member(old_token).get("/api/me/").status_code == 200
    response = operator.post(
        "/admin/queueapp/member/",
        {"action": "rotate_token", "_selected_action": [member.pk]},
        follow=True,
    )
    assert response.status_code == 200
    [message] = action_message(response)
    new_token = re.fullmatch(r"New API token for ann: (\S+)", message).group(1)
    assert new_token != old_token
    assert api.as_member(old_token).get("/api/me/").status_code == 401
    me = api.as_member(new_token).get("/api/me/")
    assert me.status_code == 200 and me.json()["name"] == "ann"


def test_rotating_a_webhook_secret_in_the_admin_changes_it(operator, api):
    member, token = factories.member("ann", "free")
    untouched, other_token = factories.member("bob", "free")
    before = api.as_member(token).get("/api/me/").json()["webhook_secret"]
    other_before = Member.objects.get(pk=untouched.pk).webhook_secret
    response = operator.post(
        "/admin/queueapp/member/",
        {"action": "rotate_webhook_secret", "_selected_action": [member.pk]},
        follow=True,
    )
    assert action_message(response) == ["Rotated 1 webhook secret(s)."]
    after = api.as_member(token).get("/api/me/").json()["webhook_secret"]
    assert after != before and after.startswith("whsec_")
    assert Member.objects.get(pk=untouched.pk).webhook_secret == other_before
    # The API token is not part of it.
    assert api.as_member(token).get("/api/me/").status_code == 200


def test_a_band_spacing_above_the_aliases_is_refused_with_the_numbers(operator):
    policy = Policy.objects.get(pk=1)
    form = {
        "aging_divisor": 60,
        "swap_affinity_bonus": 150,
        "band_spacing": 1000,
        "max_attempts": 3,
        "lease_seconds": 15,
        "queue_open": "on",
    }
    response = operator.post(f"/admin/queueapp/policy/{policy.pk}/change/", form)
    assert response.status_code == 200
    page = response.content.decode()
    assert "band spacing 1000 is larger than the 100 points between the priority aliases" in page
    assert "swap affinity bonus (150) = 152; use a band spacing of at most 100" in page
    stored = Policy.objects.get(pk=1)
    assert (stored.band_spacing, stored.swap_affinity_bonus) == (100, 10)


def test_a_tier_with_no_running_jobs_is_refused(operator):
    free = Tier.objects.get(name="free")
    response = operator.post(
        f"/admin/queueapp/tier/{free.pk}/change/", tier_form(free, max_running_jobs=0)
    )
    assert response.status_code == 200
    assert "must be at least 1: a tier&#x27;s jobs cannot be held with this limit" in (
        response.content.decode()
    )
    assert Tier.objects.get(name="free").max_running_jobs == 1


def test_lowering_a_tier_cap_in_the_admin_reclamps_its_queued_jobs(operator):
    owner, _ = factories.member("fay", "free")
    job = factories.job(owner, priority="1000")
    assert Job.objects.get(pk=job.pk).priority == 100
    free = Tier.objects.get(name="free")
    response = operator.post(
        f"/admin/queueapp/tier/{free.pk}/change/", tier_form(free, priority_cap=50)
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    assert Job.objects.get(pk=job.pk).priority == 50
    event = Job.objects.get(pk=job.pk).events.get(kind="reclamped")
    assert event.detail == {
        "priority_requested": 1000,
        "priority_was": 100,
        "priority": 50,
        "tier": "free",
        "by": "admin:op",
    }
    assert queue_lines_violations() == []


def test_a_models_parallel_is_set_in_the_admin_and_a_model_no_gpu_serves_is_refused(operator):
    for name, serves in (("gpu0", ["chat", "image"]), ("gpu1", ["video"])):
        gpu = services.gpu_register(name=name, url=f"http://{name}.lan:8080")
        services.gpu_state_record(
            gpu_id=gpu.pk, reachable=True, resident_model=None, served_models=serves
        )
    added = operator.post(
        "/admin/queueapp/modelsetting/add/", {"name": "chat", "operator_parallel": 4}
    )
    assert added.status_code == 302, added.content.decode()[:2000]
    chat = ModelSetting.objects.get(name="chat")
    assert (chat.operator_parallel, chat.parallel, chat.parallel_source) == (4, 4, "operator")
    listing = operator.get("/admin/queueapp/modelsetting/").content.decode()
    assert "chat" in listing and "gpu0" in listing and "operator" in listing

    refused = operator.post(
        "/admin/queueapp/modelsetting/add/", {"name": "audio", "operator_parallel": 2}
    )
    assert refused.status_code == 200
    assert "no GPU serves model &#x27;audio&#x27;; served: chat, image, video" in (
        refused.content.decode()
    )
    too_many = operator.post(
        "/admin/queueapp/modelsetting/add/", {"name": "image", "operator_parallel": 65}
    )
    assert too_many.status_code == 200 and not ModelSetting.objects.filter(name="image").exists()


def test_a_models_on_caller_gone_is_set_in_the_admin_blank_following_the_path(operator):
    gpu = services.gpu_register(name="gpu0", url="http://gpu0.lan:8080")
    services.gpu_state_record(
        gpu_id=gpu.pk,
        reachable=True,
        resident_model=None,
        served_models=["chat", "image", "video"],
    )
    form = operator.get("/admin/queueapp/modelsetting/add/").content.decode()
    assert "by path (drain for images, audio and /sdapi/; close otherwise)" in form
    added = operator.post(
        "/admin/queueapp/modelsetting/add/",
        {"name": "chat", "parallel": 1, "on_caller_gone": "drain"},
    )
    assert added.status_code == 302, added.content.decode()[:2000]
    assert ModelSetting.objects.get(name="chat").on_caller_gone == "drain"
    by_path = operator.post(
        "/admin/queueapp/modelsetting/add/", {"name": "image", "parallel": 1, "on_caller_gone": ""}
    )
    assert (
        by_path.status_code == 302 and ModelSetting.objects.get(name="image").on_caller_gone == ""
    )
    bad = operator.post(
        "/admin/queueapp/modelsetting/add/", {"name": "video", "parallel": 1, "on_caller_gone": "x"}
    )
    assert bad.status_code == 200 and "Select a valid choice" in bad.content.decode()
    assert not ModelSetting.objects.filter(name="video").exists()
    listing = operator.get("/admin/queueapp/modelsetting/").content.decode()
    assert 'name="form-0-on_caller_gone"' in listing


def test_the_policys_wait_bounds_are_validated_and_stored_by_band(operator):
    policy = Policy.objects.get(pk=1)
    form = {**POLICY_FORM, "queue_open": "on", "max_wait_by_band": '{"batch": -5}'}
    response = operator.post(f"/admin/queueapp/policy/{policy.pk}/change/", form)
    assert response.status_code == 200
    assert "band batch: " in response.content.decode()
    assert Policy.objects.get(pk=1).max_wait_by_band == {}
    form["max_wait_by_band"] = '{"batch": 3600, "interactive": 30}'
    response = operator.post(f"/admin/queueapp/policy/{policy.pk}/change/", form)
    assert response.status_code == 302
    assert Policy.objects.get(pk=1).max_wait_by_band == {"-100": 3600.0, "100": 30.0}


def test_the_policys_band_by_path_is_validated_and_stored_as_bands(operator):
    policy = Policy.objects.get(pk=1)
    url = f"/admin/queueapp/policy/{policy.pk}/change/"
    page = operator.get(url).content.decode()
    assert "/v1/audio/transcriptions" in page  # the defaults, shown to edit
    form = {**POLICY_FORM, "queue_open": "on", "priority_by_path": '{"/v1/audio/speach": 100}'}
    response = operator.post(url, form)
    assert response.status_code == 200
    assert "&#x27;/v1/audio/speach&#x27; is not a path gpusched serves" in response.content.decode()
    assert Policy.objects.get(pk=1).priority_by_path["/v1/audio/speech"] == 100
    form["priority_by_path"] = '{"/v1/images/generations": "background"}'
    response = operator.post(url, form)
    assert response.status_code == 302
    assert Policy.objects.get(pk=1).priority_by_path == {"/v1/images/generations": -100}


def test_a_parallel_above_a_gpus_concurrency_limit_is_a_form_error(operator):
    gpu = services.gpu_register(name="gpu0", url="http://gpu0.lan:8080")
    services.gpu_state_record(
        gpu_id=gpu.pk, reachable=True, resident_model=None, served_models=["chat"]
    )
    services.model_parallel_set(name="chat", parallel=4)  # before the config says 2
    routing = routing_parts({"models": {"chat": {"concurrencyLimit": 2}}})
    services.gpu_routing_record(gpu_id=gpu.pk, routing=routing, error="")
    setting = ModelSetting.objects.get(name="chat")
    url = f"/admin/queueapp/modelsetting/{setting.pk}/change/"

    # The config's limit bounds the parallel in use; the operator's value stays.
    setting = ModelSetting.objects.get(name="chat")
    assert (setting.operator_parallel, setting.parallel) == (4, 2)
    refused = operator.post(url, {"operator_parallel": 3, "on_caller_gone": ""})
    assert refused.status_code == 200
    assert "3 is above the concurrencyLimit 2 of model &#x27;chat&#x27; in gpu0" in (
        refused.content.decode()
    )
    assert ModelSetting.objects.get(name="chat").operator_parallel == 4
    # A parallel left as it is does not block the other setting.
    kept = operator.post(url, {"operator_parallel": 4, "on_caller_gone": "drain"})
    assert kept.status_code == 302, kept.content.decode()[:2000]
    assert ModelSetting.objects.get(name="chat").on_caller_gone == "drain"
    lowered = operator.post(url, {"operator_parallel": 2, "on_caller_gone": "drain"})
    assert lowered.status_code == 302
    assert ModelSetting.objects.get(name="chat").operator_parallel == 2

    # The list's editable column is checked the same way.
    listing = operator.post(
        "/admin/queueapp/modelsetting/",
        {
            "form-TOTAL_FORMS": "1",
            "form-INITIAL_FORMS": "1",
            "form-0-id": str(setting.pk),
            "form-0-operator_parallel": "5",
            "form-0-on_caller_gone": "drain",
            "_save": "Save",
        },
    )
    assert listing.status_code == 200 and "concurrencyLimit 2" in listing.content.decode()
    assert ModelSetting.objects.get(name="chat").operator_parallel == 2


def test_a_gpu_is_made_to_run_one_model_at_a_time_in_the_admin(operator):
    gpu = services.gpu_register(name="gpu0", url="http://gpu0.lan:8080")
    url = f"/admin/queueapp/gpu/{gpu.pk}/change/"
    assert 'name="one_model_at_a_time"' in operator.get(url).content.decode()
    saved = operator.post(url, {"enabled": "on", "allowed_models": "", "one_model_at_a_time": "on"})
    assert saved.status_code == 302, saved.content.decode()[:2000]
    assert Gpu.objects.get(pk=gpu.pk).one_model_at_a_time is True
    operator.post(url, {"enabled": "on", "allowed_models": ""})  # unticked
    assert Gpu.objects.get(pk=gpu.pk).one_model_at_a_time is False
