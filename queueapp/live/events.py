"""Announcing that the queue changed, so that only committed states are shown.

Without REDIS_URL (the default, embedded PostgreSQL): `pg_notify` inside the
transaction that makes the change. PostgreSQL delivers it at commit, to every
process that listens (the ASGI server), and never for a rolled-back change.
With REDIS_URL: a message to the Channels group through Redis, sent after
commit.
"""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.db import connection, transaction

NOTIFY_CHANNEL = "gpusched_queue"
GROUP = "queue"


def listener_connection_params() -> dict[str, Any]:
    """Keyword arguments for `psycopg.connect` that open a connection of its
    own to Django's database, for a session that LISTENs or holds a lock
    (Django's own options that psycopg does not take are left out)."""
    return {
        key: value
        for key, value in connection.get_connection_params().items()
        if key not in ("cursor_factory", "context", "prepare_threshold")
    }


def queue_changed(*, kind: str, job_id: int | None = None) -> None:
    """Call inside the transaction that changes what the dashboard shows."""
    payload = json.dumps({"kind": kind, "job": job_id})
    if settings.REDIS_URL:
        transaction.on_commit(lambda: _send_to_group(payload))
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, %s)", [NOTIFY_CHANNEL, payload])


def _send_to_group(payload: str) -> None:
    from asgiref.sync import async_to_sync
    from channels.layers import get_channel_layer

    layer = get_channel_layer()
    if layer is not None:
        async_to_sync(layer.group_send)(GROUP, {"type": "queue.changed", "payload": payload})
