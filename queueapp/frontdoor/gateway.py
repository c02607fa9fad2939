"""The front-door gateway of one web process: where waiting callers wait.

A waiting call costs a coroutine and a future here, never a thread or a
database connection:
- one connection per process LISTENs on `gpusched_gateway_<number>`; the
  jobs table's trigger (migration 0012) notifies it when one of this
  process's queued jobs is granted, cancelled or failed, and the listener
  resolves the waiting call's future;
- the same connection holds the advisory lock that tells every other
  process this one is alive (queueapp/gateways.py): when the process dies,
  its queued jobs are never granted and are cancelled within a second;
- every database call of the front door runs on a small executor whose
  threads hand their connection back to the pool after each call, so the
  connections in use stay bounded however many callers wait.

A housekeeping task reads, once a second and in one query, the state of
every job still waited for (a notification lost while the listener was
reconnecting cannot strand a caller), and cancels the queued jobs of dead
web processes (after a restart nothing is left queued without a caller).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import psycopg
from channels.db import DatabaseSyncToAsync
from django.conf import settings
from django.db import connection

from queueapp import services
from queueapp.dispatch.claim import (
    CallersGone,
    ClaimedJob,
    GpuBusy,
    job_claim_next,
    job_finish,
)
from queueapp.errors import Conflict
from queueapp.gateways import GATEWAY_LOCK_CLASS
from queueapp.models import Job, JobStatus
from queueapp.selectors import policy_get

logger = logging.getLogger(__name__)
T = TypeVar("T")

HOUSEKEEPING_SECONDS = 1.0
RECONNECT_SECONDS = 0.5
# A notification for a job no call has registered yet (its submission is
# still returning) is kept this long for it.
EARLY_NOTICE_SECONDS = 60.0


def _executor_size() -> int:
    pool = int(settings.DATABASES["default"].get("OPTIONS", {}).get("pool", {}).get("max_size", 0))
    # Half the pool: the pages, the API and /api/health/ keep the rest.
    return max(2, pool // 2) if pool else 8


_executor: ThreadPoolExecutor | None = None


def db(function: Callable[..., T]) -> Callable[..., Any]:
    """`function` as a coroutine on the front door's own threads. Each call
    checks its connection before and returns it to the pool after (Channels'
    `database_sync_to_async`), so a waiting caller holds none."""
    global _executor
    if _executor is None:
        _executor = ThreadPoolExecutor(_executor_size(), thread_name_prefix="frontdoor-db")
    return DatabaseSyncToAsync(function, thread_sensitive=False, executor=_executor)


@dataclass(frozen=True)
class Grant:
    """What became of a waited-for job: granted (with its claim), or ended."""

    status: str
    claim: ClaimedJob | None = None  # a claim made in this process
    claim_token: str = ""  # a grant by the dispatcher


class Gateway:
    def __init__(self) -> None:
        self.number: int | None = None
        self.worker = f"frontdoor@{socket.gethostname()}:{os.getpid()}"
        self.calls = 0  # admitted calls not yet answered (the waiting limit counts them)
        self.submitting = 0  # submissions whose job id is not known here yet
        self._waiting: dict[int, asyncio.Future[Grant]] = {}
        self._early: dict[int, tuple[Grant, float]] = {}
        self._started = asyncio.Event()
        self._starting: asyncio.Task | None = None
        self._tasks: list[asyncio.Task] = []

    # --- lifecycle -----------------------------------------------------------
    async def ready(self) -> None:
        """Listening and alive, from the first call of this process on."""
        if self._starting is None:
            self._starting = asyncio.get_running_loop().create_task(self._run_listener())
            self._tasks = [self._starting, asyncio.get_running_loop().create_task(self._tidy())]
        await self._started.wait()

    async def _run_listener(self) -> None:
        params = await db(_connection_params)()
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                    **params,
                    autocommit=True,
                    # A vanished host is noticed by TCP in seconds, not hours.
                    keepalives=1,
                    keepalives_idle=5,
                    keepalives_interval=2,
                    keepalives_count=3,
                ) as listener:
                    if self.number is None:
                        cursor = await listener.execute("SELECT nextval('queueapp_gateway_seq')")
                        self.number = (await cursor.fetchone())[0]
                    # After a reconnect, the same number: its queued jobs are
                    # this process's still, unless they were cancelled meanwhile.
                    await listener.execute(
                        "SELECT pg_advisory_lock(%s, %s)", [GATEWAY_LOCK_CLASS, self.number]
                    )
                    await listener.execute(f"LISTEN gpusched_gateway_{self.number}")
                    self._started.set()
                    async for notice in listener.notifies():
                        job_id, status, token = (notice.payload.split(" ", 2) + ["", ""])[:3]
                        self._deliver(int(job_id), Grant(status, claim_token=token))
            except (psycopg.Error, OSError) as exc:
                logger.warning("front-door listener lost its connection (%s); reconnecting", exc)
                await asyncio.sleep(RECONNECT_SECONDS)

    async def _tidy(self) -> None:
        await self._started.wait()
        while True:
            await asyncio.sleep(HOUSEKEEPING_SECONDS)
            try:
                pending = [job for job, future in self._waiting.items() if not future.done()]
                for job_id, status, token in await db(_ended_or_granted)(pending):
                    self._deliver(job_id, Grant(status, claim_token=token))
                await db(services.front_door_orphans_cancel)()
            except Exception:
                logger.exception("front-door housekeeping failed; trying again")
            self.release_unclaimed_grants()
            stale = time.monotonic() - EARLY_NOTICE_SECONDS
            for job_id in [job for job, (_, at) in self._early.items() if at < stale]:
                del self._early[job_id]

    # --- waiting -------------------------------------------------------------
    def expect(self, job_id: int) -> asyncio.Future[Grant]:
        """The future that resolves when `job_id` is granted or ends. The job
        is this process's until `forget`: later notices about it are ignored."""
        future = asyncio.get_running_loop().create_future()
        self._waiting[job_id] = future
        early = self._early.pop(job_id, None)
        if early is not None:
            future.set_result(early[0])
        return future

    def forget(self, job_id: int) -> None:
        """The call of `job_id` has ended (answered, refused or hung up)."""
        self._waiting.pop(job_id, None)

    def _deliver(self, job_id: int, grant: Grant) -> None:
        if grant.status == JobStatus.QUEUED:
            return
        future = self._waiting.get(job_id)
        if future is None:
            self._early[job_id] = (grant, time.monotonic())
            self.release_unclaimed_grants()
        elif not future.done():
            future.set_result(grant)
        # else: the same grant again (the trigger's notice of a claim made here)

    def release_unclaimed_grants(self) -> None:
        """A grant nobody here waits for, while no submission is on its way
        back, belongs to a caller that left: free the GPU now, not at lease
        expiry."""
        if self.submitting:
            return  # the grant may be for a job whose id is still returning
        for job_id, (grant, _) in list(self._early.items()):
            if grant.status == JobStatus.RUNNING:
                del self._early[job_id]
                asyncio.ensure_future(db(abandon)(job_id, "the caller left as the GPU was granted"))

    # --- claiming for this process's callers -------------------------------
    async def claim_for_waiting(self) -> ClaimedJob | None:
        """The dispatcher's claim, made here without its hop, when the winner
        is one of this process's callers: hands the grant to that caller and
        returns it. None when the GPU is busy, the dispatcher is claiming, or
        the winner is somebody else's (the dispatcher grants it)."""
        if self.number is None:
            return None
        outcome = await db(_claim_for_gateway)(self.number, self.worker)
        if isinstance(outcome, ClaimedJob):
            self._deliver(outcome.job_id, Grant(JobStatus.RUNNING, claim=outcome))
            return outcome
        return None

    async def stop(self) -> None:
        """Stop listening (tests; a server simply exits)."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass


def abandon(job_id: int, reason: str) -> None:
    """The caller is gone: cancel a queued job, or end a granted one as failed."""
    job = Job.objects.get(pk=job_id)
    if job.status == JobStatus.QUEUED:
        try:
            services.job_cancel(job=job, by=f"front door: {reason}")
            return
        except Conflict:  # granted meanwhile
            job = Job.objects.get(pk=job_id)
    if job.status == JobStatus.RUNNING:
        claim = ClaimedJob(
            job_id=job.pk,
            path=job.path,
            body=None,
            model=job.model,
            claim_token=job.lease_owner,
            lease_seconds=0,
            swap_needed=None,
            granted=True,
        )
        job_finish(claim=claim, answer=None, error=reason, inline_limit=0, caller_gone=True)


def _claim_for_gateway(number: int, worker: str) -> ClaimedJob | GpuBusy | CallersGone | None:
    return job_claim_next(resident_model=None, worker=worker, for_gateway=number)


def _ended_or_granted(job_ids: list[int]) -> list[tuple[int, str, str]]:
    if not job_ids:
        return []
    return list(
        Job.objects.filter(pk__in=job_ids)
        .exclude(status=JobStatus.QUEUED)
        .values_list("pk", "status", "lease_owner")
    )


def granted_claim(job_id: int, claim_token: str, path: str, model: str) -> ClaimedJob:
    """The claim the dispatcher made for this process's caller."""
    score = (
        Job.objects.filter(pk=job_id).values_list("score_at_dispatch", flat=True).first() or {}
    ).get("effective")
    return ClaimedJob(
        job_id=job_id,
        path=path,
        body=None,
        model=model,
        claim_token=claim_token,
        lease_seconds=policy_get().lease_seconds,
        swap_needed=None,
        granted=True,
        effective_score=score,
    )


def _connection_params() -> dict[str, Any]:
    return {
        key: value
        for key, value in connection.get_connection_params().items()
        if key not in ("cursor_factory", "context", "prepare_threshold")
    }


gateway = Gateway()
