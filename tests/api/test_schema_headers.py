"""The response headers /api/schema/ documents, and the answers that carry them."""

import pytest

from queueapp.models import Tier
from tests import factories
from tests.factories import submit

pytestmark = pytest.mark.django_db

SUBMISSION_HEADERS = {"X-Gpusched-Priority-Requested", "X-Gpusched-Priority-Applied", "Location"}


def openapi(api) -> dict:
    response = api.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    return response.json()


def assert_carries(documented: dict, response) -> None:
    """`response` has every header `documented` lists as required, in its type."""
    for name, header in documented.items():
        assert header["required"] is True, name
        assert name in response, f"{name} documented but not sent ({response.status_code})"
        if header["schema"]["type"] == "integer":
            int(response[name])


def test_a_submission_documents_its_priority_headers_and_location(api, default_tiers):
    created = openapi(api)["paths"]["/api/jobs/"]["post"]["responses"]["201"]
    assert set(created.get("headers", {})) == SUBMISSION_HEADERS
    _, token = factories.member("ann", "free")
    response = submit(api, token, priority="500")  # the free tier's cap is 100
    assert response.status_code == 201, response.content
    assert_carries(created["headers"], response)
    assert (response["X-Gpusched-Priority-Requested"], response["X-Gpusched-Priority-Applied"]) == (
        "500",
        "100",
    )
    assert response["Location"] == f"/api/jobs/{response.json()['id']}/"


def test_every_429_and_503_with_a_token_documents_retry_after(api, default_tiers):
    operations = [
        (f"{method.upper()} {path}", operation)
        for path, methods in openapi(api)["paths"].items()
        for method, operation in methods.items()
    ]
    missing = [
        f"{name} {code}"
        for name, operation in operations
        for code in ("429", "503")
        if code in operation["responses"]
        and name != "GET /api/health/"
        and "Retry-After" not in operation["responses"][code].get("headers", {})
    ]
    assert not missing, f"429 or 503 without Retry-After: {missing}"
    assert len(operations) >= 15
    # The health check's 503 is its own report (database down), sent without one.
    health = dict(operations)["GET /api/health/"]["responses"]["503"]
    assert "Retry-After" not in health.get("headers", {})


def test_the_answers_that_document_retry_after_send_it(api, default_tiers, settings):
    paths = openapi(api)["paths"]  # read first: the last call below locks the client out
    responses = paths["/api/jobs/"]["post"]["responses"]
    Tier.objects.filter(name="free").update(max_queued_jobs=1)
    _, token = factories.member("ann", "free")
    assert submit(api, token).status_code == 201
    over_limit = submit(api, token)
    assert over_limit.status_code == 429
    assert_carries(responses["429"]["headers"], over_limit)
    factories.policy(queue_open=False)
    closed = submit(api, token)
    assert closed.status_code == 503
    assert_carries(responses["503"]["headers"], closed)
    # The other 429: too many failed logins from one address.
    settings.GPUSCHED_AUTH_FAILURES_PER_MINUTE = 2
    for _ in range(2):
        assert api.as_member("wrong").get("/api/me/").status_code == 401
    locked_out = api.as_member(token).get("/api/me/")
    assert locked_out.status_code == 429
    assert_carries(paths["/api/me/"]["get"]["responses"]["429"]["headers"], locked_out)
