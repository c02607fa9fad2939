"""The test database as other sessions and processes reach it."""

from __future__ import annotations

from urllib.parse import quote

from django.db import connection


def database_url() -> str:
    """A DATABASE_URL for the test database this process uses."""
    db = connection.settings_dict
    credentials = quote(db["USER"] or "", safe="")
    if db.get("PASSWORD"):
        credentials += ":" + quote(db["PASSWORD"], safe="")
    host = quote(db["HOST"] or "localhost", safe="")
    port = f":{db['PORT']}" if db.get("PORT") else ""
    return f"postgresql://{credentials}@{host}{port}/{db['NAME']}"


def sessions_waiting_on_locks() -> int:
    """How many sessions of this test database wait for a lock right now."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return cursor.fetchone()[0]
