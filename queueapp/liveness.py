"""Who is alive: front-door gateways (web processes holding waiting
callers) and GPU dispatchers, as SQL for the claim, the services and the
readers.

Each holds a session-level advisory lock on the connection it listens on:
a gateway `(GATEWAY_LOCK_CLASS, its number)` (queueapp/frontdoor/gateway.py),
a GPU's dispatch pass `(DISPATCHER_LOCK_CLASS, the GPU's id)`
(queueapp/dispatch/wakeup.py). PostgreSQL releases the lock the moment that
connection ends, so a process killed by SIGKILL is seen gone at once, with
no heartbeat to write and no timeout to wait for. A process on another
machine that vanishes without closing its socket is seen gone when TCP
keepalive gives up on it (the listeners set short keepalives).

The claim asks for the dispatchers before leaving a job to another idle GPU
that has the job's model loaded: a GPU whose dispatcher is gone is not
idle, it is out. It asks for the gateways before granting a front-door job:
a caller whose web process died is never granted the GPU.

This module is SQL only, below the services and the claim, which both ask it.
"""

from __future__ import annotations

from django.db import connection

from queueapp.locks import DISPATCHER_LOCK_CLASS, GATEWAY_LOCK_CLASS


def _lock_holders_sql(lock_class: int) -> str:
    """The second keys of the advisory locks of `lock_class` held now, as a
    sub-select. pg_locks is read once per statement that uses it, not once
    per row. Advisory locks are server-wide: only this database's count
    (two installations may share a server)."""
    return f"""
    SELECT objid::bigint FROM pg_locks
     WHERE locktype = 'advisory' AND classid = {lock_class}
       AND objsubid = 2 AND granted
       AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
"""


# The numbers of the gateways alive now.
LIVE_GATEWAYS_SQL = _lock_holders_sql(GATEWAY_LOCK_CLASS)
# The ids of the GPUs whose dispatcher is alive now.
LIVE_DISPATCHERS_SQL = _lock_holders_sql(DISPATCHER_LOCK_CLASS)


# Right after PostgreSQL starts (a restart, a failover), every live web
# process is still reconnecting its listener and holds no lock yet: no
# gateway is judged gone until this long after the server's start, so a
# database restart never cancels or fails the calls of processes that live.
RECONNECT_GRACE_SECONDS = 5
JUDGING_SQL = f"pg_postmaster_start_time() < now() - interval '{RECONNECT_GRACE_SECONDS} seconds'"


def gateway_gone_sql(column: str) -> str:
    """SQL that is true when the gateway in `column` (a front-door job's) is
    gone: it holds no lock, and the server has run long enough to tell."""
    return f"({column} IS NOT NULL AND {column} NOT IN ({LIVE_GATEWAYS_SQL}) AND {JUDGING_SQL})"


def dispatcher_alive_sql(column: str) -> str:
    """SQL that is true when the GPU whose id is in `column` has a live
    dispatcher, or the server started too recently to tell (its dispatchers
    are still reconnecting)."""
    return f"({column} IN ({LIVE_DISPATCHERS_SQL}) OR NOT {JUDGING_SQL})"


def gateways_gone_with_queued_jobs() -> list[int]:
    """Gateways that still have queued jobs but no longer hold their lock."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT DISTINCT gateway FROM queueapp_job
             WHERE status = 'queued' AND front_door AND {gateway_gone_sql("gateway")}
            """
        )
        return [row[0] for row in cursor.fetchall()]
