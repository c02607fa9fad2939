"""POST /api/preload/: a job that only loads a model, at background priority
unless the caller names one (the header wins over the field)."""

import pytest

from queueapp.models import Job
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
