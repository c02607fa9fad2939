"""The front door's last resort (queueapp/frontdoor/calls.py `front_door_app`):
an exception nobody expected is OpenAI's JSON 500 with an error id, never
the web server's HTML page, and the log has the same id with the traceback."""

from __future__ import annotations

import logging

import pytest

from queueapp.frontdoor import calls
from queueapp.frontdoor.model_list import MODELS_PATH
from queueapp.models import Job
from tests import factories
from tests.frontdoor.client import FrontDoorClient


class Planted(RuntimeError):
    """Raised on purpose inside the front door."""


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/audio/transcriptions", MODELS_PATH])
def test_an_unexpected_exception_is_openais_json_500_with_an_id_in_the_log(
    default_tiers, monkeypatch, caplog, path
):
    _, token = factories.member("ann", "free")

    async def broken(call, reply):  # type: ignore[no-untyped-def]
        raise Planted("planted in the front door")

    monkeypatch.setattr(calls, "_answer", broken)
    client = FrontDoorClient()
    auth = {"HTTP_AUTHORIZATION": f"Bearer {token}"}
    with caplog.at_level(logging.ERROR, logger="queueapp.frontdoor.calls"):
        if path == MODELS_PATH:
            response = client.get(path, **auth)
        else:
            response = client.post(
                path, data=b'{"model": "m"}', content_type="application/json", **auth
            )

    assert response.status_code == 500
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert error["type"] == "server_error" and error["code"] == "internal_error", error
    error_id = response.headers["x-gpusched-error-id"]
    assert error_id and error_id in error["message"], error
    logged = [record for record in caplog.records if error_id in record.getMessage()]
    assert logged, [record.getMessage() for record in caplog.records]
    assert logged[0].exc_info and logged[0].exc_info[0] is Planted
    assert not Job.objects.exists()
