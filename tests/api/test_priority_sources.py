"""Where a REST job's band comes from: the header, a top-level `priority`,
or, when the call names none, the policy's band for its path."""

import pytest

from queueapp.models import Job, Policy
from tests import factories
from tests.factories import chat_body

pytestmark = pytest.mark.django_db

SPEECH = {"model": "voice", "input": "hello", "voice": "alloy"}


def submit(api, token, *, header=None, path="/v1/chat/completions", body=None, **fields):
    """POST /api/jobs/ with `fields` at the top level (`priority` among them)
    and `header` as X-LlamaSwap-Priority."""
    headers = {"HTTP_X_LLAMASWAP_PRIORITY": header} if header is not None else {}
    payload = {"path": path, "body": body if body is not None else chat_body(), **fields}
    return api.as_member(token).post("/api/jobs/", payload, format="json", **headers)


def bands(response) -> tuple[int, int]:
    assert response.status_code == 201, response.content
    job = response.json()
    assert response["X-Gpusched-Priority-Applied"] == str(job["priority"])
    return job["priority_requested"], job["priority"]


def test_a_top_level_priority_sets_the_band_and_the_header_wins(api, default_tiers):
    _, token = factories.member("ann", "free")
    assert bands(submit(api, token, priority="background")) == (-100, -100)
    assert bands(submit(api, token, priority=-5)) == (-5, -5)
    assert bands(submit(api, token, header="interactive", priority="batch")) == (100, 100)
    # The tier's cap and floor clamp it; garbage means 0, as in the header.
    assert bands(submit(api, token, priority=1000000)) == (1000000, 100)
    assert bands(submit(api, token, priority=-5000)) == (-5000, -1000)
    assert bands(submit(api, token, priority="soon")) == (0, 0)
    assert bands(submit(api, token, priority=1.5)) == (0, 0)


def test_the_body_goes_to_llama_swap_as_given(api, default_tiers):
    _, token = factories.member("ann", "free")
    body = chat_body(priority="kept")  # inside `body`, it is the request's own field
    response = submit(api, token, body=body, priority="batch")
    assert bands(response) == (-100, -100)
    assert Job.objects.get(pk=response.json()["id"]).body == body


def test_speech_without_a_priority_is_interactive_and_chat_normal(api, default_tiers):
    _, token = factories.member("ann", "free")
    assert bands(submit(api, token, path="/v1/audio/speech", body=SPEECH)) == (100, 100)
    assert bands(submit(api, token)) == (0, 0)
    named = submit(api, token, path="/v1/audio/speech", body=SPEECH, priority=None)
    assert bands(named) == (100, 100)  # null names none
    asked = submit(api, token, path="/v1/audio/speech", body=SPEECH, header="batch")
    assert bands(asked) == (-100, -100)
    assert bands(submit(api, token, path="/v1/audio/speech", body=SPEECH, header="0")) == (0, 0)


def test_the_band_by_path_is_read_and_set_by_staff(api, default_tiers):
    _, token = factories.member("ann", "free")
    _, staff = factories.member("ops", "free", staff=True)
    policy = api.as_member(token).get("/api/policy/").json()
    assert policy["priority_by_path"] == {
        "/v1/audio/speech": 100,
        "/v1/audio/transcriptions": 100,
    }
    wanted = {"/v1/images/generations": "batch", "/v1/audio/speech": 50}
    changed = api.as_member(staff).patch(
        "/api/policy/", {"priority_by_path": wanted}, format="json"
    )
    assert changed.status_code == 200, changed.content
    stored = {"/v1/images/generations": -100, "/v1/audio/speech": 50}
    assert changed.json()["priority_by_path"] == stored
    assert Policy.objects.get(pk=1).priority_by_path == stored
    image = {"model": "image-xl", "prompt": "a fox"}
    assert bands(submit(api, token, path="/v1/images/generations", body=image)) == (-100, -100)
    assert bands(submit(api, token, path="/v1/audio/speech", body=SPEECH)) == (50, 50)
    for bad, named in (
        ({"/v1/audio/speach": 100}, "/v1/audio/speach"),
        ({"/v1/audio/speech": "soon"}, "soon"),
        ([], "an object"),
    ):
        refused = api.as_member(staff).patch(
            "/api/policy/", {"priority_by_path": bad}, format="json"
        )
        assert refused.status_code == 400
        detail = refused.json()["detail"]
        assert detail.startswith("priority_by_path:") and named in detail
    assert Policy.objects.get(pk=1).priority_by_path == stored


def test_with_no_policy_row_the_defaults_apply(api, default_tiers):
    Policy.objects.all().delete()
    _, token = factories.member("ann", "free")
    assert bands(submit(api, token, path="/v1/audio/speech", body=SPEECH)) == (100, 100)


def test_the_schema_shows_both_ways_to_ask(api, default_tiers):
    schema = api.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    submit_op = schema["paths"]["/api/jobs/"]["post"]
    header = next(p for p in submit_op["parameters"] if p["name"] == "X-LlamaSwap-Priority")
    assert "background" in header["description"] and "priority" in header["description"]
    body = schema["components"]["schemas"]["JobSubmitInput"]["properties"]["priority"]
    assert "header wins" in body["description"] and "background (-100)" in body["description"]
    policy = schema["components"]["schemas"]["Policy"]["properties"]["priority_by_path"]
    assert "interactive" in policy["description"]
