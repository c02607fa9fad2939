"""POST /api/preload/: a job that only loads a model, at background priority
unless the caller names one (the header wins over the field)."""

import pytest

from queueapp import services
from queueapp.models import Gpu, Job, Member
from tests import factories

pytestmark = pytest.mark.django_db


@pytest.fixture
def member_api(api, default_tiers):
    _, token = factories.member("ann", "pro")
    return api.as_member(token)


def test_a_preload_queues_a_load_of_the_model_at_minus_100(member_api):
    answer = member_api.post("/api/preload/", {"model": "org/image-xl"}, format="json")
    assert answer.status_code == 201, answer.content
    job = answer.json()
    assert (job["path"], job["model"], job["status"]) == (
        "/upstream/org/image-xl/",
        "org/image-xl",
        "queued",
    )
    assert (job["priority_requested"], job["priority"]) == (-100, -100)
    assert answer["X-Gpusched-Priority-Applied"] == "-100"
    assert answer["Location"] == f"/api/jobs/{job['id']}/"
    assert Job.objects.get(pk=job["id"]).body == {"model": "org/image-xl"}


@pytest.mark.parametrize(
    ("field", "header", "applied"),
    [
        ("interactive", None, 100),
        (5, None, 5),
        ("garbage", None, 0),
        (None, None, -100),
        ("interactive", "-7", -7),
        (None, " +100 ", 100),
    ],
)
def test_the_header_wins_over_the_priority_field(member_api, field, header, applied):
    payload = {"model": "chat"} | ({} if field is None else {"priority": field})
    headers = {} if header is None else {"HTTP_X_LLAMASWAP_PRIORITY": header}
    answer = member_api.post("/api/preload/", payload, format="json", **headers)
    assert answer.status_code == 201, answer.content
    assert answer.json()["priority"] == applied


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({}, "model"),
        ({"model": ""}, "model"),
        ({"model": 3}, "model"),
        ({"model": "a", "x": 1}, "x"),
    ],
)
def test_invalid_input_is_a_400_naming_the_field(member_api, payload, field):
    answer = member_api.post("/api/preload/", payload, format="json")
    assert answer.status_code == 400
    assert field in answer.json()["detail"]
    assert not Job.objects.exists()


def test_anonymous_preload_is_401(api, default_tiers):
    assert api.post("/api/preload/", {"model": "chat"}, format="json").status_code == 401


def registered(name: str, *, serves: list[str], enabled: bool = True):
    gpu = services.gpu_register(name=name, url=f"http://{name}.lan:8080")
    services.gpu_state_record(
        gpu_id=gpu.pk, reachable=True, resident_model=None, served_models=serves
    )
    if not enabled:
        Gpu.objects.filter(pk=gpu.pk).update(enabled=False)
    return gpu


def test_a_preload_may_name_its_gpu_which_alone_runs_it(member_api):
    registered("gpu0", serves=["chat"])
    registered("gpu1", serves=["chat", "image"])
    answer = member_api.post("/api/preload/", {"model": "image", "gpu": "gpu1"}, format="json")
    assert answer.status_code == 201, answer.content
    assert answer.json()["pinned_gpu"] == "gpu1"
    assert Job.objects.get().pinned_gpu == "gpu1"
    unpinned = member_api.post("/api/preload/", {"model": "chat"}, format="json")
    assert unpinned.json()["pinned_gpu"] is None


@pytest.mark.parametrize(
    ("gpu", "message"),
    [
        ("gpu9", "gpu: no GPU is named 'gpu9'; the GPUs: gpu0, gpu1, off"),
        ("gpu0", "gpu: gpu0 does not run 'image'; it runs: chat"),
        ("off", "gpu: off is disabled: it claims no job"),
    ],
)
def test_a_gpu_that_cannot_load_the_model_is_a_400_naming_it(member_api, gpu, message):
    registered("gpu0", serves=["chat"])
    registered("gpu1", serves=["chat", "image"])
    registered("off", serves=["image"], enabled=False)
    answer = member_api.post("/api/preload/", {"model": "image", "gpu": gpu}, format="json")
    assert (answer.status_code, answer.json()["detail"]) == (400, message)
    assert not Job.objects.exists()


def test_the_queue_shows_a_preload_as_one(member_api):
    preload = member_api.post("/api/preload/", {"model": "image"}, format="json").json()
    factories.job(Member.objects.get(name="ann"), model="chat")
    queued = member_api.get("/api/queue/").json()["queued"]
    assert [(entry["id"], entry["preload"]) for entry in queued][-1] == (preload["id"], True)
    assert [entry["preload"] for entry in queued][0] is False
