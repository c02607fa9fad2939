"""GET /api/models/ and PATCH /api/models/{name}/: each model's `parallel`
(jobs of it one GPU runs at once), set by staff; and its running jobs on
/metrics."""

import pytest

from queueapp import services
from queueapp.dispatch.claim import job_claim_next
from queueapp.models import ModelSetting
from tests import factories
from tests.api.helpers import scrape, value

pytestmark = pytest.mark.django_db


def registered(name: str, serves: list[str]):
    gpu = services.gpu_register(name=name, url=f"http://{name}.lan:8080")
    services.gpu_state_record(
        gpu_id=gpu.pk, reachable=True, resident_model=serves[0], served_models=serves
    )
    return gpu


def test_the_models_are_listed_with_their_parallel_and_gpus(api, default_tiers):
    registered("gpu0", ["chat", "image"])
    registered("gpu1", ["chat"])
    _, token = factories.member("ann", "pro")
    listed = api.as_member(token).get("/api/models/")
    assert listed.status_code == 200
    assert listed.json() == [
        {"name": "chat", "parallel": 1, "gpus": ["gpu0", "gpu1"]},
        {"name": "image", "parallel": 1, "gpus": ["gpu0"]},
    ]


def test_staff_set_parallel_and_everyone_else_is_refused(api, default_tiers):
    registered("gpu0", ["chat", "image"])
    registered("gpu1", ["chat"])
    _, member = factories.member("ann", "pro")
    _, staff = factories.member("boss", "pro", staff=True)
    assert (
        api.as_member(member).patch("/api/models/chat/", {"parallel": 4}, format="json").status_code
        == 403
    )
    changed = api.as_member(staff).patch("/api/models/chat/", {"parallel": 4}, format="json")
    assert changed.status_code == 200
    assert changed.json() == {"name": "chat", "parallel": 4, "gpus": ["gpu0", "gpu1"]}
    assert ModelSetting.objects.get(name="chat").parallel == 4
    assert api.as_member(member).get("/api/models/").json()[0]["parallel"] == 4
    api.credentials()
    assert api.get("/api/models/").status_code == 401


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"parallel": 0}, "parallel"),
        ({"parallel": 65}, "parallel"),
        ({"parallel": "four"}, "parallel"),
        ({}, "parallel"),
        ({"parallel": 2, "paralel": 2}, "paralel"),
    ],
)
def test_a_bad_parallel_is_a_400_naming_the_field(api, default_tiers, payload, field):
    registered("gpu0", ["chat"])
    registered("gpu1", ["chat"])
    _, staff = factories.member("boss", "pro", staff=True)
    answer = api.as_member(staff).patch("/api/models/chat/", payload, format="json")
    assert answer.status_code == 400 and answer.json()["detail"].startswith(field)
    assert not ModelSetting.objects.exists()


def test_a_model_no_gpu_serves_is_a_404_naming_those_served(api, default_tiers):
    registered("gpu0", ["chat", "image"])
    registered("gpu1", ["video"])
    _, staff = factories.member("boss", "pro", staff=True)
    answer = api.as_member(staff).patch("/api/models/audio/", {"parallel": 2}, format="json")
    assert answer.status_code == 404
    assert "served: chat, image, video" in answer.json()["detail"]


def test_gpus_and_metrics_show_the_slots_in_use(api, client, default_tiers):
    gpu0 = registered("gpu0", ["chat"])
    services.model_parallel_set(name="chat", parallel=4)
    ann, token = factories.member("ann", "pro")
    jobs = [factories.job(ann, model="chat") for _ in range(3)]
    for _ in jobs:
        job_claim_next(resident_model="chat", worker="test", gpu=gpu0.pk)
    (listed,) = api.as_member(token).get("/api/gpus/").json()
    assert listed["slots"] == 4 and listed["slots_in_use"] == 3
    assert listed["running_jobs"] == [job.pk for job in jobs]
    assert listed["running_job"] == jobs[0].pk
    samples = scrape(client)
    assert value(samples, "gpusched_model_in_flight", model="chat", gpu="gpu0") == 3
    assert value(samples, "gpusched_model_parallel", model="chat") == 4
    assert value(samples, "gpusched_running_jobs") == 3
