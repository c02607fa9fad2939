"""Which GPUs' dispatchers are alive, as SQL for the claim and the readers.

Each GPU's dispatch pass holds a session-level advisory lock,
`(DISPATCHER_LOCK_CLASS, the GPU's id)`, on the connection it listens for
work on (queueapp/dispatch/wakeup.py), as a front-door web process holds
its gateway's (queueapp/gateways.py): PostgreSQL releases it the moment
that connection ends, so a dispatcher killed by SIGKILL is seen gone at
once. The claim asks it before leaving a job to another idle GPU that has
the job's model loaded: a GPU whose dispatcher is gone is not idle, it is
out.
"""

from __future__ import annotations

from django.db import connection

from queueapp.locks import DISPATCHER_LOCK_CLASS

# The ids of the GPUs whose dispatcher is alive now, as a sub-select.
LIVE_DISPATCHERS_SQL = f"""
    SELECT objid::bigint FROM pg_locks
     WHERE locktype = 'advisory' AND classid = {DISPATCHER_LOCK_CLASS}
       AND objsubid = 2 AND granted
       AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
"""


def gpus_with_live_dispatcher() -> set[int]:
    with connection.cursor() as cursor:
        cursor.execute(LIVE_DISPATCHERS_SQL)
        return {row[0] for row in cursor.fetchall()}
