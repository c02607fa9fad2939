"""Shared slots: the jobs a pass runs side by side on its GPU.

A model whose `parallel` is more than one lets several of its jobs share
the GPU (why, and how a claim fills the slots: queueapp/policy/decide.py).
The pass runs each such job on a thread of its own and goes on claiming
while they run; the end's notice (`freed <gpu>`) wakes it for the slot a
job frees. One more thread renews all their leases
(queueapp/dispatch/heartbeat.py). A job of a one-at-a-time model runs in
the pass itself, as it always did.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from django.db import connection

from queueapp.dispatch.database_retry import BACKOFF_FIRST_SECONDS
from queueapp.dispatch.forwarding import Refused
from queueapp.dispatch.heartbeat import slots_heartbeat
from queueapp.dispatch.lease_keeper import LeaseKeeper
from queueapp.dispatch.outcomes import ClaimedJob

logger = logging.getLogger(__name__)


class SharedSlots:
    """The jobs a pass runs side by side on its GPU, one thread each: jobs
    of a model whose `parallel` lets several share the GPU. Each thread
    forwards its job and ends it; one lease keeper renews all their leases,
    on one connection, so a slot costs a database connection only while its
    end is written."""

    def __init__(self, run: Callable[[ClaimedJob], Refused | None]) -> None:
        self._run = run
        self._in_flight: dict[int, tuple[ClaimedJob, threading.Thread]] = {}  # by job id
        self._lock = threading.Lock()
        # The lease thread, started with the first job and stopped when none is in flight.
        self._leases: LeaseKeeper | None = None
        # llama-swap refused a job (429) or could not be reached: no new
        # slot is claimed before this (time.monotonic()).
        self.hold_off_until = 0.0

    def start(self, claim: ClaimedJob) -> None:
        thread = threading.Thread(
            target=self._serve, args=(claim,), name=f"slot-{claim.job_id}", daemon=True
        )
        with self._lock:
            self._in_flight[claim.job_id] = (claim, thread)
            if self._leases is None:
                self._leases = slots_heartbeat(self._claims)
                self._leases.start()
        thread.start()

    def _claims(self) -> list[ClaimedJob]:
        with self._lock:
            return [claim for claim, _ in self._in_flight.values()]

    def _serve(self, claim: ClaimedJob) -> None:
        try:
            refused = self._run(claim)
            if refused is not None:
                with self._lock:
                    until = time.monotonic() + (refused.retry_after or BACKOFF_FIRST_SECONDS)
                    self.hold_off_until = max(self.hold_off_until, until)
        except Exception:  # its lease runs out and recovery re-queues it
            logger.exception("job %s: its slot failed", claim.job_id)
        finally:
            connection.close()  # this thread's own connection
            with self._lock:
                self._in_flight.pop(claim.job_id, None)

    @property
    def in_flight_model(self) -> str | None:
        """The model of the jobs in flight here (llama-swap has it loaded); None: none."""
        claims = self._claims()
        return claims[0].model if claims else None

    def wait_all(self) -> None:
        """Until every job in flight here has ended; then the lease thread stops."""
        while True:
            with self._lock:
                threads = [thread for _, thread in self._in_flight.values()]
            if not threads:
                break
            for thread in threads:
                thread.join()
        if self._leases is not None:
            self._leases.stop()
            self._leases = None
