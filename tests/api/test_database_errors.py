"""A 503 says whether PostgreSQL is away or the process's pool is only busy."""

import json

from django.db import OperationalError
from django.test import RequestFactory
from psycopg_pool import PoolTimeout

from queueapp.error_pages import database_unavailable
from queueapp.frontdoor.calls import _database_problem


def pool_timeout() -> OperationalError:
    """As Django raises it when the pool hands out no connection in time."""
    try:
        try:
            raise PoolTimeout("couldn't get a connection after 5.00 sec")
        except PoolTimeout as cause:
            raise OperationalError(str(cause)) from cause
    except OperationalError as wrapped:
        return wrapped


def test_an_exhausted_pool_is_a_busy_server_not_a_missing_database():
    request = RequestFactory().get("/api/jobs/")
    busy = database_unavailable(request, pool_timeout())
    assert busy.status_code == 503 and busy["Retry-After"] == "1"
    detail = json.loads(busy.content)["detail"]
    assert "busy" in detail and "unavailable" not in detail
    away = database_unavailable(request, OperationalError("connection refused"))
    assert away["Retry-After"] == "5" and "unavailable" in json.loads(away.content)["detail"]


def test_the_front_door_tells_the_two_apart_in_openai_shape():
    busy = json.loads(_database_problem(pool_timeout()).body)["error"]
    away = json.loads(_database_problem(OperationalError("connection refused")).body)["error"]
    assert (busy["code"], away["code"]) == ("server_busy", "database_unavailable")
