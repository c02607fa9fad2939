"""The REST contract: fields, isolation, clear 400s (no dispatcher involved)."""

import pytest

from queueapp.models import Job, JobEvent, JobStatus
from tests import factories
from tests.factories import chat_body, submit

pytestmark = pytest.mark.django_db


def test_submit_answers_201_with_the_job(api, default_tiers):
    _, token = factories.member("ann", "pro")
    response = submit(api, token, priority="batch")
    assert response.status_code == 201, response.content
    job = response.json()
    assert job["status"] == "queued"
    assert (job["priority_requested"], job["priority"]) == (-100, -100)
    assert job["model"] == "chat-small"
    assert job["path"] == "/v1/chat/completions"
    assert job["score"]["band"] == -100
    assert job["score"]["tier_bonus"] == 1
    assert job["score"]["as_of"] == "now"
    assert set(job["score"]) >= {"band", "tier_bonus", "swap_affinity", "aging", "effective"}
    assert job["submitted_at"] and job["started_at"] is None and job["result"] is None
    assert response["Location"] == f"/api/jobs/{job['id']}/"
    assert JobEvent.objects.filter(job_id=job["id"], kind="submitted").count() == 1
    # The answer links its explanation, as JSON and as the page.
    assert job["links"]["why"].endswith(f"/api/jobs/{job['id']}/why/")
    assert job["links"]["why_page"].endswith(f"/jobs/{job['id']}/why/")
    assert api.get(job["links"]["why"]).status_code == 200


def test_s7_priority_above_the_cap_is_clamped_and_both_values_shown(api, default_tiers):
    _, token = factories.member("fred", "free")
    response = submit(api, token, priority="1000000")
    assert response.status_code == 201
    assert response.json()["priority_requested"] == 1000000
    assert response.json()["priority"] == 100
    assert response["X-Gpusched-Priority-Requested"] == "1000000"
    assert response["X-Gpusched-Priority-Applied"] == "100"


@pytest.mark.parametrize(
    ("header", "expected"),
    [(None, 0), ("abc", 0), ("1.5", 0), (" +100 ", 100), ("INTERACTIVE", 100), ("-100", -100)],
)
def test_s8_header_values(api, default_tiers, header, expected):
    _, token = factories.member("sam", "free")
    response = submit(api, token, priority=header)
    assert response.status_code == 201
    assert response.json()["priority"] == expected
    assert response.json()["priority_requested"] == expected


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"body": chat_body()}, "path"),
        ({"path": "/v1/nope", "body": chat_body()}, "path"),
        ({"path": "/v1/chat/completions", "body": ["not", "an", "object"]}, "body"),
        ({"path": "/v1/chat/completions", "body": {"messages": []}}, "body.model"),
        ({"path": "/v1/chat/completions", "body": {"model": ""}}, "body.model"),
        ({"path": "/v1/chat/completions", "body": {"model": "  "}}, "body.model"),
        # \x1c is a space to Python's str.strip(), a character to the schema's \s.
        ({"path": "/v1/chat/completions", "body": {"model": "\x1c\x1c"}}, "body.model"),
        ({"path": "/v1/chat/completions", "body": {"model": "chat\nsmall"}}, "body.model"),
        ({"path": "/v1/chat/completions"}, "body"),
        (
            {"path": "/v1/chat/completions", "body": chat_body(), "callback_url": "ftp://x/y"},
            "callback_url",
        ),
        (
            {
                "path": "/v1/chat/completions",
                "body": chat_body(),
                "chain": {"id": "f", "index": 5, "total": 5},
            },
            "chain.index",
        ),
        # `priority` is a field now; a misspelt one is still refused by name.
        ({"path": "/v1/chat/completions", "body": chat_body(), "priorty": 5}, "priorty"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(api, default_tiers, payload, field):
    _, token = factories.member("bea", "free")
    response = api.as_member(token).post("/api/jobs/", payload, format="json")
    assert response.status_code == 400, response.content
    assert response.json()["detail"].startswith(f"{field}:"), response.json()
    assert Job.objects.count() == 0


def test_oversized_body_is_refused(api, default_tiers, settings):
    settings.GPUSCHED_MAX_BODY_BYTES = 1000
    _, token = factories.member("olga", "free")
    response = submit(api, token, body=chat_body(padding="x" * 2000))
    assert response.status_code == 413
    detail = response.json()["detail"]
    assert detail.startswith("body:") and "1000 bytes" in detail, detail
    assert "GPUSCHED_MAX_BODY_BYTES raises it" in detail, detail
    assert Job.objects.count() == 0


def test_anonymous_and_bad_tokens_get_401(api, default_tiers):
    for path in ["/api/jobs/", "/api/queue/", "/api/me/", "/api/policy/", "/api/jobs/1/"]:
        assert api.get(path).status_code == 401, path
    assert api.as_member("gps_wrong").get("/api/me/").status_code == 401
    api.credentials(HTTP_AUTHORIZATION="Token abc")
    assert api.get("/api/me/").status_code == 401


def test_members_only_see_and_cancel_their_own_jobs(api, default_tiers):
    _, ann = factories.member("ann", "free")
    _, bob = factories.member("bob", "free")
    job_id = submit(api, ann).json()["id"]
    assert api.as_member(bob).get(f"/api/jobs/{job_id}/").status_code == 404
    assert api.as_member(bob).delete(f"/api/jobs/{job_id}/").status_code == 404
    assert api.as_member(bob).get("/api/jobs/999999/").status_code == 404
    assert Job.objects.get(pk=job_id).status == JobStatus.QUEUED
    assert api.as_member(ann).get(f"/api/jobs/{job_id}/").status_code == 200


def test_cancel_a_queued_job_and_409_once_started(api, default_tiers):
    owner, token = factories.member("ann", "free")
    job_id = submit(api, token).json()["id"]
    response = api.as_member(token).delete(f"/api/jobs/{job_id}/")
    assert response.status_code == 200
    assert response.json()["status"] == "cancelled"
    assert response.json()["finished_at"]
    started = factories.job(owner)
    Job.objects.filter(pk=started.pk).update(status=JobStatus.RUNNING)
    response = api.as_member(token).delete(f"/api/jobs/{started.pk}/")
    assert response.status_code == 409
    assert "never interrupted" in response.json()["detail"]


def test_queue_hides_other_members_names_unless_staff(api, default_tiers):
    ann, ann_token = factories.member("ann", "free")
    _, staff_token = factories.member("ops", "max", staff=True)
    bob, bob_token = factories.member("bob", "pro")
    factories.job(ann, priority="batch")
    factories.job(bob, priority="interactive")
    seen_by_ann = api.as_member(ann_token).get("/api/queue/").json()
    assert [entry["priority"] for entry in seen_by_ann["queued"]] == [100, -100]
    assert [entry["member"] for entry in seen_by_ann["queued"]] == [None, "ann"]
    assert [entry["mine"] for entry in seen_by_ann["queued"]] == [False, True]
    assert "bob" not in str(seen_by_ann)
    assert seen_by_ann["queued_total"] == 2
    assert {band["band"]: band["queued"] for band in seen_by_ann["bands"]} == {100: 1, -100: 1}
    seen_by_staff = api.as_member(staff_token).get("/api/queue/").json()
    assert [entry["member"] for entry in seen_by_staff["queued"]] == ["bob", "ann"]
    assert api.as_member(bob_token).get("/api/queue/").json()["queued"][0]["mine"] is True
    # Per member: counts for all, names for staff and the viewer's own.
    assert [(m["member"], m["mine"], m["queued"]) for m in seen_by_ann["members"]] == [
        ("ann", True, 1),
        (None, False, 1),
    ]
    assert seen_by_ann["members_total"] == 2
    assert [m["member"] for m in seen_by_staff["members"]] == ["ann", "bob"]


def test_queue_pages_with_offset_and_limit(api, default_tiers):
    ann, token = factories.member("ann", "free")
    jobs = [factories.job(ann) for _ in range(5)]
    whole = api.as_member(token).get("/api/queue/").json()
    assert [entry["id"] for entry in whole["queued"]] == [job.pk for job in jobs]
    page = api.as_member(token).get("/api/queue/?offset=1&limit=2").json()
    assert [(entry["position"], entry["id"]) for entry in page["queued"]] == [
        (2, jobs[1].pk),
        (3, jobs[2].pk),
    ]
    assert page["queued_total"] == 5 and page["running"] is None
    assert api.as_member(token).get("/api/queue/?offset=5").json()["queued"] == []
    for query, field in [
        ("limit=0", "limit"),
        ("limit=201", "limit"),
        ("limit=2.5", "limit"),
        ("offset=-1", "offset"),
        ("offset=2000", "offset"),
        ("offset=" + "9" * 5000, "offset"),
        ("page=2", "page"),
    ]:
        refused = api.as_member(token).get(f"/api/queue/?{query}")
        assert refused.status_code == 400, query
        assert refused.json()["detail"].startswith(f"{field}: "), refused.json()


def test_me_shows_name_tier_and_webhook_secret(api, default_tiers):
    _, token = factories.member("ann", "max")
    me = api.as_member(token).get("/api/me/").json()
    assert me["name"] == "ann" and me["tier"] == "max"
    assert me["webhook_secret"].startswith("whsec_")


def test_policy_read_by_members_changed_by_staff_only(api, default_tiers):
    _, token = factories.member("ann", "free")
    _, staff = factories.member("ops", "free", staff=True)
    policy = api.as_member(token).get("/api/policy/").json()
    assert policy["aging_divisor"] == 60 and policy["swap_affinity_bonus"] == 10
    assert (
        api.as_member(token).patch("/api/policy/", {"aging_divisor": 30}, format="json").status_code
        == 403
    )
    response = api.as_member(staff).patch("/api/policy/", {"aging_divisor": 0.5}, format="json")
    assert response.status_code == 200 and response.json()["aging_divisor"] == 0.5


def test_policy_that_breaks_the_invariant_is_refused_with_the_numbers(api, default_tiers):
    _, staff = factories.member("ops", "free", staff=True)
    response = api.as_member(staff).patch(
        "/api/policy/", {"swap_affinity_bonus": 98}, format="json"
    )
    assert response.status_code == 400
    assert "band spacing 100" in response.json()["detail"]
    assert "(2, tier max)" in response.json()["detail"]
    assert api.as_member(staff).get("/api/policy/").json()["swap_affinity_bonus"] == 10
    bad = api.as_member(staff).patch("/api/policy/", {"aging_divisor": 0}, format="json")
    assert bad.status_code == 400 and bad.json()["detail"].startswith("aging_divisor:")


def test_policy_borrowing_guard_is_read_and_set_by_staff(api, default_tiers):
    _, staff = factories.member("ops", "free", staff=True)
    policy = api.as_member(staff).get("/api/policy/").json()
    assert policy["borrow_keep_idle_gpus"] == 0 and policy["borrow_max_seconds"] is None
    changed = api.as_member(staff).patch(
        "/api/policy/", {"borrow_keep_idle_gpus": 1, "borrow_max_seconds": 90}, format="json"
    )
    assert changed.status_code == 200, changed.content
    guard = changed.json()
    assert (guard["borrow_keep_idle_gpus"], guard["borrow_max_seconds"]) == (1, 90)
    # `false` was read as 0 (make fuzz at 1,000 examples found it): JSON types as stated.
    bad_values = [("borrow_keep_idle_gpus", -1), ("borrow_max_seconds", -5)]
    bad_values += [("borrow_max_seconds", False), ("borrow_max_seconds", "90")]
    for field, value in bad_values:
        bad = api.as_member(staff).patch("/api/policy/", {field: value}, format="json")
        assert bad.status_code == 400 and bad.json()["detail"].startswith(f"{field}:")


def test_policy_change_rekeys_queued_jobs(api, default_tiers):
    owner, _ = factories.member("ann", "free")
    first = factories.job(owner)
    before = Job.objects.get(pk=first.pk).rank_key
    factories.policy(aging_divisor=30)
    after = Job.objects.get(pk=first.pk).rank_key
    assert after != before
    age = first.eligible_at.timestamp() - 1735689600.0
    assert after == pytest.approx(0 - age / 30)


def test_health_is_public(api, default_tiers):
    response = api.get("/api/health/")
    assert response.status_code == 200
    assert response.json()["database"] == "ok"


def test_openapi_schema_lists_the_api(api, default_tiers):
    response = api.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    paths = response.json()["paths"]
    for path in [
        "/api/jobs/",
        "/api/jobs/{job_id}/",
        "/api/queue/",
        "/api/me/",
        "/api/policy/",
        "/api/health/",
    ]:
        assert path in paths


def test_openapi_schema_generates_without_warnings(tmp_path):
    from django.core.management import call_command

    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(tmp_path / "s.yml"))
    assert "/api/jobs/{job_id}/" in (tmp_path / "s.yml").read_text()


def test_a_closed_queue_answers_503_and_keeps_what_is_queued(api, default_tiers):
    owner, token = factories.member("ann", "free")
    kept = factories.job(owner)
    factories.policy(queue_open=False)
    response = submit(api, token)
    assert response.status_code == 503
    assert response["Retry-After"] == "60"
    assert "closed for maintenance" in response.json()["detail"]
    assert list(Job.objects.values_list("id", flat=True)) == [kept.pk]


def test_a_job_claimed_before_its_answer_is_rendered_shows_as_running(default_tiers, rf):
    """The dispatcher may claim a job between its submission and the 201."""
    from queueapp.api.views import render_job
    from queueapp.dispatch.claim import job_claim_next

    owner, _ = factories.member("ann", "free")
    submitted = factories.job(owner)
    assert job_claim_next(resident_model=None, worker="test").job_id == submitted.pk
    rendered = render_job(submitted, rf.get("/api/jobs/"))
    assert rendered["status"] == "running"
    assert rendered["estimate"] is None


@pytest.mark.parametrize("model", ["chat-small", "a b", "\ufeffx", "modèle", "x" * 200])
def test_model_names_the_schema_allows_are_accepted(api, default_tiers, model):
    import re

    from queueapp.job_body import MODEL_NAME_PATTERN

    assert re.search(MODEL_NAME_PATTERN, model)
    _, token = factories.member("bea", "free")
    payload = {"path": "/v1/chat/completions", "body": {"model": model}}
    assert api.as_member(token).post("/api/jobs/", payload, format="json").status_code == 201
