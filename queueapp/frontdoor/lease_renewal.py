"""The lease of a front-door job while its caller's process uses the GPU.

A granted job's claim holds the GPU for `lease_seconds`; the process that
makes the call to llama-swap renews it every `lease_renew_interval`
(queueapp/dispatch/lease.py), on the front door's GPU-path threads, so a
process that dies loses the GPU within one lease. The relay starts it before
the body goes out and stops it once the job's end is handed over
(queueapp/frontdoor/relay.py).
"""

from __future__ import annotations

import asyncio

from queueapp.dispatch.claim import ClaimedJob
from queueapp.dispatch.lease import job_lease_renew, lease_renew_interval
from queueapp.frontdoor.gateway import db


class LeaseRenewal:
    """Renews the granted job's lease while this call uses the GPU."""

    def __init__(self, claim: ClaimedJob) -> None:
        self.claim = claim
        self._task: asyncio.Task | None = None

    async def _renew(self) -> None:
        while True:
            await asyncio.sleep(lease_renew_interval(self.claim.lease_seconds))
            await db(job_lease_renew, gpu_path=True)(claim=self.claim)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._renew())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
