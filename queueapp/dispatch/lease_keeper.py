"""Keeping a lease: the claims one holds renewed on a clock until stopped.

Whoever runs a claimed job renews its lease (queueapp/dispatch/lease.py):
the heartbeat beside the job a pass forwards itself
(queueapp/dispatch/heartbeat.py), the one lease thread of a pass's shared
slots (queueapp/dispatch/shared_slots.py), and a front-door caller's web
process. They differ in how they wait (a thread, a coroutine) and in what
else they do meanwhile; what renewing means is the same, and lives here.

Every `lease_renew_interval` of the shortest lease held (worked out once,
when the keeper starts), each claim's lease is extended. A lease another
claim took is logged once ("lease lost during the call") and not renewed
again: every later write of the old claim matches its token and changes
nothing, so there is nothing more to keep. A renewal that fails (the
database restarting) is logged and tried again at the next one, so a lease
that ran out while nobody could read it is renewed when the database
returns.

Why the renewing step (`LeaseKeeper.renew`) is a plain synchronous callable
and the keeper owns only the timing and the stop: the thread calls it
directly, on its own database connection; a coroutine runs the same step on
a database thread of its choosing (`start_task`), so the event loop never
blocks on the database and both models share one rule.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Sequence

from django.db import close_old_connections, connection

from queueapp.dispatch.lease import job_lease_renew, lease_renew_interval
from queueapp.dispatch.outcomes import HeldClaim

logger = logging.getLogger(__name__)

# A keeper that holds nothing when it starts (a shared slot that ended at
# once) wakes this often.
NOTHING_HELD_WAKE_SECONDS = 0.5


def _renew_lease(claim: HeldClaim) -> bool:
    return job_lease_renew(claim=claim)


class LeaseKeeper:
    """Renews the leases of the claims `held()` names, every
    `lease_renew_interval` of the shortest, until stopped: on a thread of
    its own (`start`, or `with`), or as a task of the running event loop
    (`start_task`). A lease another claim took is logged once and let go.
    On the thread, `beside` runs at every wake, every `wake_every` seconds
    when given (else at each renewal): the chores of a holder that waits
    meanwhile."""

    def __init__(
        self,
        held: Callable[[], Sequence[HeldClaim]],
        *,
        name: str = "lease",
        renew: Callable[[HeldClaim], bool] = _renew_lease,
        beside: Callable[[], object] | None = None,
        wake_every: float | None = None,
    ) -> None:
        self._held = held
        self._renew_one = renew
        self._beside = beside
        self._wake_every = wake_every
        self._lost: set[str] = set()  # claim tokens whose lease another took
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._task: asyncio.Task[None] | None = None

    @classmethod
    def of(
        cls,
        claim: HeldClaim,
        *,
        beside: Callable[[], object] | None = None,
        wake_every: float | None = None,
    ) -> LeaseKeeper:
        """A keeper of one claim's lease."""
        return cls(
            lambda: [claim], name=f"lease-{claim.job_id}", beside=beside, wake_every=wake_every
        )

    def interval(self) -> float:
        """Seconds between two renewals of the leases held now."""
        seconds = min((claim.lease_seconds for claim in self._held()), default=0.0)
        return lease_renew_interval(seconds) if seconds else NOTHING_HELD_WAKE_SECONDS

    def renew(self) -> None:
        """The renewing step: every lease held and not lost, extended now."""
        for claim in self._held():
            if claim.claim_token in self._lost:
                continue
            if not self._renew_one(claim):
                logger.warning("job %s: lease lost during the call", claim.job_id)
                self._lost.add(claim.claim_token)

    def start(self) -> None:
        self._thread.start()

    def start_task(self, run_step: Callable[[Callable[[], None]], Awaitable[object]]) -> None:
        """Renew from a task of the running event loop: `run_step(self.renew)`
        runs the step where a database call may block."""
        self._task = asyncio.get_running_loop().create_task(self._keep(run_step))

    def stop(self) -> None:
        """Renew no more: the thread has ended when this returns; a task is
        cancelled."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        if self._task is not None:
            self._task.cancel()

    def __enter__(self) -> LeaseKeeper:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _run(self) -> None:
        interval = self.interval()
        renew_at = time.monotonic() + interval
        wait = interval if self._wake_every is None else min(interval, self._wake_every)
        try:
            while not self._stop.wait(wait):
                try:
                    if self._beside is not None:
                        self._beside()
                    if time.monotonic() < renew_at:
                        continue
                    renew_at = time.monotonic() + interval
                    self.renew()
                except Exception:  # the database may be restarting; keep trying
                    logger.exception("lease renewal failed")
                    close_old_connections()
        finally:
            connection.close()  # this thread's own connection

    async def _keep(self, run_step: Callable[[Callable[[], None]], Awaitable[object]]) -> None:
        interval = self.interval()
        while True:
            await asyncio.sleep(interval)
            try:
                await run_step(self.renew)
            except Exception:  # the database may be restarting; keep trying
                logger.exception("lease renewal failed")
