"""GET /api/gpus/, the GPU a job ran on, and health per GPU; a model no GPU
serves refused with the models that are."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from queueapp import services
from queueapp.dispatch.claim import job_claim_next
from queueapp.models import Gpu, Job, JobStatus
from queueapp.policy.routing import routing_parts
from tests import factories
from tests.factories import chat_body, submit

pytestmark = pytest.mark.django_db


@pytest.fixture
def registered(dispatchers_alive):
    """Register a GPU whose dispatcher saw llama-swap (up, or not `reachable`)
    serving `serves`, the first loaded; its dispatcher alive unless not
    `followed`."""

    def register(name: str, *, serves: list[str], reachable: bool = True, followed: bool = True):
        gpu = services.gpu_register(name=name, url=f"http://{name}.lan:8080")
        services.gpu_state_record(
            gpu_id=gpu.pk, reachable=reachable, resident_model=serves[0], served_models=serves
        )
        if followed:
            dispatchers_alive(gpu)
        return gpu

    return register


def test_the_gpus_are_listed_with_their_url_for_staff_only(api, registered, default_tiers):
    registered("gpu0", serves=["chat", "image"])
    gpu1 = registered("gpu1", serves=["video"], reachable=False)
    services.gpu_update(
        gpu=gpu1, enabled=True, allowed_models=[], min_band=0, max_expected_seconds=60
    )
    _, member = factories.member("ann", "pro")
    _, staff = factories.member("boss", "pro", staff=True)

    listed = api.as_member(member).get("/api/gpus/").json()
    assert [gpu["name"] for gpu in listed] == ["gpu0", "gpu1"]
    first, second = listed
    assert first["models"] == ["chat", "image"] and first["resident_model"] == "chat"
    assert first["healthy"] is True and second["healthy"] is False
    assert second["reservation"] == {"min_band": 0, "max_expected_seconds": 60.0}
    assert "url" not in first
    as_staff = api.as_member(staff).get("/api/gpus/").json()
    assert as_staff[0]["url"] == "http://gpu0.lan:8080"
    api.credentials()  # no token
    assert api.get("/api/gpus/").status_code == 401


def test_a_job_says_which_gpu_runs_it(api, registered, default_tiers):
    gpu = registered("gpu7", serves=["chat-small"])
    _, token = factories.member("ann", "pro")
    job_id = submit(api, token).json()["id"]
    assert api.as_member(token).get(f"/api/jobs/{job_id}/").json()["gpu"] is None
    job_claim_next(resident_model=None, worker="test", gpu=gpu.pk)
    assert api.as_member(token).get(f"/api/jobs/{job_id}/").json()["gpu"] == "gpu7"


def test_health_names_the_gpu_that_is_down(api, registered, default_tiers):
    registered("gpu0", serves=["chat"])
    registered("gpu1", serves=["chat"], reachable=False)
    health = api.get("/api/health/").json()
    assert health["status"] == "degraded"
    assert {gpu["name"]: gpu["healthy"] for gpu in health["gpus"]} == {"gpu0": True, "gpu1": False}


def test_a_gpu_no_dispatcher_holds_shows_no_dispatcher_and_health_names_it(
    api, registered, default_tiers
):
    registered("gpu0", serves=["chat"])
    registered("gpu1", serves=["image"], followed=False)
    _, member = factories.member("ann", "pro")

    listed = {gpu["name"]: gpu for gpu in api.as_member(member).get("/api/gpus/").json()}
    assert listed["gpu0"]["health"] == "healthy" and listed["gpu0"]["dispatcher_alive"] is True
    gone = listed["gpu1"]
    assert gone["health"] == "no dispatcher" and gone["healthy"] is False
    assert gone["dispatcher_alive"] is False
    # What it had loaded when its dispatcher left is not shown as loaded.
    assert gone["resident_model"] is None and gone["resident_models"] == []
    health = api.get("/api/health/").json()
    assert health["status"] == "degraded"
    assert health["problems"] == ["GPU gpu1: no dispatcher (nothing claims jobs for it)"]

    # Disabled, it is out of service: no longer a problem.
    staff = factories.member("boss", "pro", staff=True)[1]
    assert (
        api.as_member(staff)
        .patch("/api/gpus/gpu1/", {"enabled": False}, format="json")
        .json()["health"]
        == "disabled"
    )
    assert api.get("/api/health/").json()["status"] == "ok"


def test_a_model_no_gpu_serves_is_a_400_naming_the_models_served(api, registered, default_tiers):
    registered("gpu0", serves=["chat"])
    registered("gpu1", serves=["image"])
    _, token = factories.member("ann", "pro")
    refused = api.as_member(token).post(
        "/api/jobs/",
        {"path": "/v1/chat/completions", "body": chat_body("video-wan")},
        format="json",
    )
    assert refused.status_code == 400
    assert refused.json()["detail"].startswith("model: ")
    assert "chat, image" in refused.json()["detail"]


def test_busy_models_count_the_jobs_of_each_model_running_on_the_gpu(
    api, registered, default_tiers
):
    gpu0 = registered("gpu0", serves=["chat-small", "embed-small", "tts-kokoro"])
    registered("gpu1", serves=["chat-small"])
    ann, token = factories.member("ann", "pro")
    # Jobs of two co-resident models side by side, as the claim leaves them.
    for slot, model in enumerate(["chat-small", "tts-kokoro", "chat-small"]):
        job = factories.job(ann, model=model)
        Job.objects.filter(pk=job.pk).update(
            status=JobStatus.RUNNING, is_lane_head=False, gpu=gpu0, gpu_slot=slot
        )

    listed = api.as_member(token).get("/api/gpus/").json()
    assert [gpu["busy_models"] for gpu in listed] == [{"chat-small": 2, "tts-kokoro": 1}, {}]
    health = api.get("/api/health/").json()
    assert health["gpus"][0]["busy_models"] == {"chat-small": 2, "tts-kokoro": 1}
    # Read with the running jobs in one query, not per GPU: a third GPU costs none.
    with CaptureQueriesContext(connection) as two:
        api.as_member(token).get("/api/gpus/")
    registered("gpu2", serves=["chat-small"])
    with CaptureQueriesContext(connection) as three:
        api.as_member(token).get("/api/gpus/")
    assert len(three) == len(two)


def test_staff_make_a_gpu_run_one_model_at_a_time_and_the_list_shows_it(
    api, registered, default_tiers
):
    gpu = registered("gpu0", serves=["chat"])
    _, member = factories.member("ann", "pro")
    _, staff = factories.member("boss", "pro", staff=True)
    assert api.as_member(member).get("/api/gpus/").json()[0]["one_model_at_a_time"] is False

    changed = api.as_member(staff).patch(
        "/api/gpus/gpu0/", {"one_model_at_a_time": True}, format="json"
    )
    assert changed.status_code == 200, changed.content
    assert changed.json()["name"] == "gpu0" and changed.json()["one_model_at_a_time"] is True
    assert Gpu.objects.get(pk=gpu.pk).one_model_at_a_time is True
    listed = api.as_member(member).get("/api/gpus/").json()
    assert listed[0]["one_model_at_a_time"] is True and listed[0]["enabled"] is True


@pytest.mark.parametrize(
    ("payload", "detail"),
    [
        (
            {"one_model_at_a_time": "yes"},
            "one_model_at_a_time: must be true or false, not a string",
        ),
        ({"one_model_at_a_time": 1}, "one_model_at_a_time: must be true or false, not an integer"),
        ({"one_model_at_a_time": True, "url": "http://x"}, "url: unknown field"),
        ({}, "enabled or one_model_at_a_time: give one or both"),
    ],
)
def test_a_bad_gpu_change_is_a_400_that_names_the_field(
    api, registered, default_tiers, payload, detail
):
    registered("gpu0", serves=["chat"])
    _, staff = factories.member("boss", "pro", staff=True)
    answer = api.as_member(staff).patch("/api/gpus/gpu0/", payload, format="json")
    assert answer.status_code == 400 and answer.json()["detail"] == detail
    assert Gpu.objects.get(name="gpu0").one_model_at_a_time is False


def test_a_gpu_change_by_a_member_is_a_403_and_of_an_unknown_gpu_a_404(
    api, registered, default_tiers
):
    registered("gpu0", serves=["chat"])
    _, member = factories.member("ann", "pro")
    _, staff = factories.member("boss", "pro", staff=True)
    change = {"one_model_at_a_time": True}
    refused = api.as_member(member).patch("/api/gpus/gpu0/", change, format="json")
    assert refused.status_code == 403
    assert Gpu.objects.get(name="gpu0").one_model_at_a_time is False
    missing = api.as_member(staff).patch("/api/gpus/gpu9/", change, format="json")
    assert missing.status_code == 404
    assert missing.json()["detail"] == "no GPU named 'gpu9'; GPUs: gpu0"
    api.credentials()
    assert api.patch("/api/gpus/gpu0/", change, format="json").status_code == 401


def test_with_several_gpus_a_models_alias_is_served_and_runs_as_on_one(
    api, registered, default_tiers
):
    """llama-swap lists model ids at /v1/models; its config's aliases and
    setParamsByID keys are names of those models too."""
    config = {
        "models": {
            "chat-small": {"aliases": ["chat"], "filters": {"setParamsByID": {"chat:hot": {}}}},
            "image": {},
        }
    }
    gpu0 = registered("gpu0", serves=["chat-small", "image"])
    registered("gpu1", serves=["image"])
    services.gpu_routing_record(gpu_id=gpu0.pk, routing=routing_parts(config), error="")
    _, token = factories.member("ann", "pro")

    created = [
        api.as_member(token).post(
            "/api/jobs/", {"path": "/v1/chat/completions", "body": chat_body(name)}, format="json"
        )
        for name in ("chat", "chat:hot")
    ]
    assert [answer.status_code for answer in created] == [201, 201], created[0].json()
    claimed = job_claim_next(resident_model="chat-small", worker="test", gpu=gpu0.pk)
    assert claimed.job_id == created[0].json()["id"]  # gpu0 serves it, by its alias
    # The models list names each model once, by its id.
    listed = [model["name"] for model in api.as_member(token).get("/api/models/").json()]
    assert listed == ["chat-small", "image"]

    # A config reloaded without the alias: the name is no longer served.
    services.gpu_routing_record(
        gpu_id=gpu0.pk, routing=routing_parts({"models": {"chat-small": {}, "image": {}}}), error=""
    )
    assert Gpu.objects.get(pk=gpu0.pk).served_models == ["chat-small", "image"]
    refused = api.as_member(token).post(
        "/api/jobs/", {"path": "/v1/chat/completions", "body": chat_body("chat")}, format="json"
    )
    assert refused.status_code == 400
