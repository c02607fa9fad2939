"""Waiting out PostgreSQL: the pass's backoff, and a job's write retried.

PostgreSQL away (a restart, a failover) does not end a pass: it backs off
(from BACKOFF_FIRST_SECONDS, doubling to BACKOFF_MAX_SECONDS, as it does
for a llama-swap away or busy) and claims again once the server is back,
without waiting for the every-minute schedule that restarts a dead pass.
An answer llama-swap already gave is kept in memory and its write retried
(`until_database_answers`), so the job is stored once, never run again; a
lease renewal matches only the claim token, so a lease that ran out while
nobody could read it is renewed when the database returns
(queueapp/dispatch/lease_keeper.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from django.db import close_old_connections

from queueapp.dispatch.outcomes import ClaimedJob
from queueapp.errors import DATABASE_ERRORS

logger = logging.getLogger(__name__)
T = TypeVar("T")

BACKOFF_FIRST_SECONDS = 0.5
BACKOFF_MAX_SECONDS = 30.0
# How long a finished job's answer is kept in memory while PostgreSQL is away
# (a restart, a failover) before the pass gives up on storing it.
DATABASE_OUTAGE_MAX_SECONDS = 600.0


def until_database_answers(write: Callable[[], T], *, claim: ClaimedJob) -> T:
    """Retry the write that ends a job while PostgreSQL is away, so an answer
    llama-swap already gave is stored rather than the job run again. A write
    that did commit before the connection broke is fenced by the claim token,
    so a retry never records it twice."""
    give_up_at = time.monotonic() + DATABASE_OUTAGE_MAX_SECONDS
    pause = BACKOFF_FIRST_SECONDS
    while True:
        try:
            return write()
        except DATABASE_ERRORS as exc:
            if time.monotonic() + pause > give_up_at:
                raise  # the lease expires and recovery re-queues the job
            logger.warning(
                "job %s: database unavailable, retrying the write in %.1f s: %s",
                claim.job_id,
                pause,
                exc,
            )
            close_old_connections()
            time.sleep(pause)
            pause = min(pause * 2, BACKOFF_MAX_SECONDS)
