"""Announcing that the queue changed, so that only committed states are shown.

Why not Channels' in-memory layer: the process that changes the queue is
usually not the one serving the page (the GPU cluster starts and ends jobs,
Daphne serves the WebSockets), and that layer delivers nothing between
processes. PostgreSQL is already there, so it carries the notices unless
Redis is configured.

Without REDIS_URL (the default, embedded PostgreSQL): `pg_notify` inside the
transaction that makes the change. PostgreSQL delivers it at commit, to every
process that listens (the ASGI server), and never for a rolled-back change.
With REDIS_URL: a message to the Channels group through Redis, sent after
commit. On the paths every job takes (a submission, a claim, an end) the
notice is an expression selected by the statement that writes the change
(`queue_notice`), not a round trip of its own.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
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
    notice = queue_notice(kind=kind, job_id=job_id)
    if notice.params:
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT {notice.sql}", notice.params)


@dataclass(frozen=True)
class QueueNotice:
    """`queue_changed` as an expression to select in the statement that makes
    the change: one round trip fewer on the paths every job takes."""

    sql: str  # uses the named parameters below; selects NULL when none
    params: dict[str, str]


def queue_notice(*, kind: str, job_id: int | None = None) -> QueueNotice:
    """Call inside the transaction that changes what the dashboard shows, and
    select `sql` (with `params`) in one of its statements. Over Redis the
    message is sent on commit, and `sql` is a plain NULL."""
    payload = json.dumps({"kind": kind, "job": job_id})
    if settings.REDIS_URL:
        transaction.on_commit(lambda: _send_to_group(payload))
        return QueueNotice("NULL", {})
    return QueueNotice(
        "pg_notify(%(notice_channel)s, %(notice_payload)s)",
        {"notice_channel": NOTIFY_CHANNEL, "notice_payload": payload},
    )


def _send_to_group(payload: str) -> None:
    from asgiref.sync import async_to_sync
    from channels.layers import get_channel_layer

    layer = get_channel_layer()
    if layer is not None:
        async_to_sync(layer.group_send)(GROUP, {"type": "queue.changed", "payload": payload})
