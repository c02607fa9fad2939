"""The front-door gateway of one web process: where waiting callers wait.

A waiting call costs a coroutine and a future here, never a thread or a
database connection:
- one connection per process LISTENs on `gpusched_gateway_<number>`; the
  jobs table's trigger (queueapp/sql/job_notify.sql) notifies it when one of
  this process's queued jobs is granted, cancelled or failed (a
  `GatewayNotice`, queueapp/job_notices.py), and the listener resolves the
  waiting call's future;
- the same connection holds the advisory lock that tells every other
  process this one is alive (queueapp/liveness.py): when the process dies,
  its queued jobs are never granted and are cancelled within a second;
- every database call of the front door runs on a small executor whose
  threads hand their connection back to the pool after each call, so the
  connections in use stay bounded however many callers wait.

A grant's notice carries what the call needs to use it (claim token, lease
length and expiry, score), so nothing is read between the grant and the
request to llama-swap. After llama-swap answers, the answer goes to the
caller first and the job's end is written meanwhile (`finish_soon`), with
the claim for the next caller waiting here in the same commit; a job can
thus read `running` for a few milliseconds after its caller has the answer.

A housekeeping task reads, once a second and in one query, the state of
every job still waited for (a notification lost while the listener was
reconnecting cannot strand a caller), cancels the queued jobs of dead
web processes (after a restart nothing is left queued without a caller),
and, while callers wait here, expires the queued jobs past their wait bound
(services.jobs_expire_overdue), so a bound holds even with no dispatcher.
While a call relayed here holds a GPU, it also runs the holder watchdog
(services.jobs_report_running_long): a front-door job runs in this process,
not in a dispatcher.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import psycopg
from channels.db import DatabaseSyncToAsync
from django.conf import settings
from django.db import OperationalError
from django.db.models import Max

from queueapp import services
from queueapp.dispatch.lease import job_end_and_grant, job_end_durable
from queueapp.dispatch.outcomes import ClaimedJob, ClaimRecord, HeldClaim
from queueapp.errors import DATABASE_ERRORS, Conflict
from queueapp.frontdoor.server_slots import server_slots_read
from queueapp.frontdoor.waiting import StatusBoard, queued_statuses
from queueapp.job_notices import GatewayNotice, gateway_channel
from queueapp.live.events import listener_connection_params
from queueapp.locks import GATEWAY_LOCK_CLASS
from queueapp.models import Gpu, Job, JobStatus, ModelSetting, OnCallerGone
from queueapp.services.running_long import RUNNING_LONG_CHECK_SECONDS
from queueapp.upstream.client import UpstreamAnswer, upstream_auth_headers

logger = logging.getLogger(__name__)
T = TypeVar("T")

HOUSEKEEPING_SECONDS = 1.0
RECONNECT_SECONDS = 0.5
# How long a call waits for its process's listener (PostgreSQL away) before a 503.
READY_TIMEOUT_SECONDS = 5.0
# A notification for a job no call has registered yet (its submission is
# still returning) is kept this long for it.
EARLY_NOTICE_SECONDS = 60.0
# Writing a relayed job's end is retried this long while PostgreSQL is away,
# pausing from the first to the longest pause, doubling.
FINISH_RETRY_SECONDS = 60.0
FINISH_RETRY_FIRST_PAUSE = 0.1
FINISH_RETRY_MAX_PAUSE = 1.0


def _admission_threads() -> int:
    pool = int(settings.DATABASES["default"].get("OPTIONS", {}).get("pool", {}).get("max_size", 0))
    # Half the pool in all: the pages, the API and /api/health/ keep the rest.
    return max(2, pool // 2 - GPU_PATH_THREADS) if pool else 6


# The GPU's own path (claim, finish, lease renewal, release) runs on threads of
# its own: a burst of a thousand submissions queued on the admission threads
# never delays the call that holds the GPU, or the claim of the next one.
GPU_PATH_THREADS = 2
_executors: dict[bool, ThreadPoolExecutor] = {}


def db(function: Callable[..., T], *, gpu_path: bool = False) -> Callable[..., Any]:
    """`function` as a coroutine on the front door's own threads. Each call
    checks its connection before and returns it to the pool after (Channels'
    `database_sync_to_async`), so a waiting caller holds none."""
    if gpu_path not in _executors:
        threads = GPU_PATH_THREADS if gpu_path else _admission_threads()
        _executors[gpu_path] = ThreadPoolExecutor(
            threads, thread_name_prefix="frontdoor-gpu" if gpu_path else "frontdoor-db"
        )
    return DatabaseSyncToAsync(function, thread_sensitive=False, executor=_executors[gpu_path])


@dataclass(frozen=True)
class Grant:
    """What became of a waited-for job: granted (with its claim), or ended."""

    status: str
    # None unless granted: the claim made here (`hand_over`), or the record
    # a grant's notice carries.
    claim: HeldClaim | None = None
    lease_expires_at: float = 0.0  # epoch seconds, by the database's clock

    @classmethod
    def from_notice(cls, notice: GatewayNotice) -> Grant:
        """From the trigger's notice, or the same read by housekeeping. The
        GPU's URL is the gateway's to add. Raises ValueError for a granted
        job's notice without its claim."""
        if notice.status != JobStatus.RUNNING:
            return cls(notice.status)
        if (
            notice.claim_token is None
            or notice.lease_seconds is None
            or notice.lease_expires_at is None
        ):
            raise ValueError(f"job {notice.job} was granted without a claim: {notice}")
        claim = ClaimRecord(
            job_id=notice.job,
            claim_token=notice.claim_token,
            lease_seconds=notice.lease_seconds,
            gpu_id=notice.gpu,
            granted=True,
            effective_score=notice.effective_score,
        )
        return cls(notice.status, claim, lease_expires_at=notice.lease_expires_at)


class Gateway:
    def __init__(self) -> None:
        self.number: int | None = None
        self.worker = f"frontdoor@{socket.gethostname()}:{os.getpid()}"
        self.calls = 0  # admitted calls not yet answered (the waiting limit counts them)
        self.submitting = 0  # submissions whose job id is not known here yet
        # Granted jobs whose calls run here and whose end is not written
        # yet: while there is one, the GPU is busy (size 1), and its end
        # claims for the callers waiting here. Read by the admission's
        # thread; a stale value costs one needless claim attempt, or leaves
        # the claim to the dispatcher, never a wrong grant.
        self.held: set[int] = set()
        # The enabled GPUs' llama-swap URLs by id, read by housekeeping: a
        # grant names its GPU by id (a GPU registered since is read at once).
        self.gpu_urls: dict[int, str] = {}
        self.gpu_names: dict[int, str] = {}  # their names, for their keys (auth_headers)
        # The most jobs of one model a GPU runs at once (the largest
        # `parallel`), read with the URLs.
        self.slots_per_gpu = 1
        self._waiting: dict[int, asyncio.Future[Grant]] = {}
        self._early: dict[int, tuple[Grant, float]] = {}
        self._started = asyncio.Event()
        self._starting: asyncio.Task | None = None
        self._tasks: list[asyncio.Task] = []
        self._finishing: dict[int, asyncio.Task] = {}  # by job id
        # Where this process's waiting streams stand (queueapp/frontdoor/waiting.py).
        self.statuses = StatusBoard(lambda job_ids: db(queued_statuses)(job_ids))
        # Granted jobs whose caller hung up, their request to llama-swap still
        # being closed or drained (`after_caller_left`), by job id.
        self._leaving: dict[int, asyncio.Task] = {}

    # --- lifecycle -----------------------------------------------------------
    async def ready(self) -> None:
        """Listening and alive, from the first call of this process on."""
        if self._starting is None:
            self._starting = asyncio.get_running_loop().create_task(self._run_listener())
            self._tasks = [self._starting, asyncio.get_running_loop().create_task(self._tidy())]
        try:
            await asyncio.wait_for(self._started.wait(), READY_TIMEOUT_SECONDS)
        except TimeoutError:
            # Nothing is queued without a listener to hear its grant.
            raise OperationalError("the front door cannot listen on the database") from None

    async def _run_listener(self) -> None:
        params = await db(listener_connection_params)()
        self.gpu_urls, self.gpu_names, self.slots_per_gpu = await db(_enabled_gpus)()
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
                        row = await cursor.fetchone()
                        assert row is not None  # nextval always answers one row
                        self.number = row[0]
                    # After a reconnect, the same number: its queued jobs are
                    # this process's still, unless they were cancelled meanwhile.
                    await listener.execute(
                        "SELECT pg_advisory_lock(%s, %s)", [GATEWAY_LOCK_CLASS, self.number]
                    )
                    await listener.execute(f"LISTEN {gateway_channel(self.number)}")
                    self._started.set()
                    async for heard in listener.notifies():
                        notice = GatewayNotice.parse(heard.payload)
                        self._deliver(notice.job, Grant.from_notice(notice))
            except (psycopg.Error, OSError) as exc:
                logger.warning("front-door listener lost its connection (%s); reconnecting", exc)
                await asyncio.sleep(RECONNECT_SECONDS)

    async def _tidy(self) -> None:
        await self._started.wait()
        running_long_at = 0.0  # time.monotonic() of the watchdog's next sweep
        while True:
            await asyncio.sleep(HOUSEKEEPING_SECONDS)
            try:
                self.gpu_urls, self.gpu_names, self.slots_per_gpu = await db(_enabled_gpus)()
                pending = [job for job, future in self._waiting.items() if not future.done()]
                # On the admission threads: the GPU path's are for the GPU.
                for notice in await db(_ended_or_granted)(pending):
                    self._deliver(notice.job, Grant.from_notice(notice))
                await db(services.front_door_orphans_cancel)()
                if pending:  # this process's callers waiting: their bounds are swept too
                    await db(services.jobs_expire_overdue)()
                if self.held and time.monotonic() >= running_long_at:
                    running_long_at = time.monotonic() + RUNNING_LONG_CHECK_SECONDS
                    await db(services.jobs_report_running_long)()
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

    def waiting_job_ids(self) -> list[int]:
        """The jobs this process's callers wait for (neither granted nor ended yet)."""
        return [job for job, future in self._waiting.items() if not future.done()]

    def forget(self, job_id: int) -> None:
        """The call of `job_id` has ended (answered, refused or hung up)."""
        self._waiting.pop(job_id, None)

    def _deliver(self, job_id: int, grant: Grant) -> None:
        if grant.status == JobStatus.QUEUED:
            return
        future = self._waiting.get(job_id)
        if future is None and (job_id in self.held or self.finishing(job_id)):
            # A late notice of the grant a call here relays, or is ending,
            # after the call stopped waiting: not a grant nobody waits for,
            # which would be abandoned under the end being written.
            return
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
                asyncio.ensure_future(
                    db(abandon, gpu_path=True)(job_id, "the caller left as the GPU was granted")
                )

    def claims_at_admission(self) -> bool:
        """Whether a new call should try to claim a GPU as it is queued: not
        while this process's calls hold every GPU (their ends claim for the
        callers waiting here, and a burst of submissions costs no claims).
        A GPU counts for as many jobs as a model may share it with."""
        return len(self.held) < max(1, len(self.gpu_urls) * self.slots_per_gpu)

    async def upstream_url(self, gpu_id: int | None) -> str:
        """The llama-swap URL of GPU `gpu_id`."""
        if gpu_id is not None and gpu_id not in self.gpu_urls:
            self.gpu_urls, self.gpu_names, self.slots_per_gpu = await db(_enabled_gpus)()
        url = self.gpu_urls.get(gpu_id) if gpu_id is not None else None
        return url or settings.GPUSCHED_UPSTREAMS[0].url

    async def auth_headers(self, gpu_id: int | None) -> dict[str, str]:
        """gpusched's key for GPU `gpu_id`'s llama-swap (`upstream_auth_headers`):
        the caller's own credentials never go there."""
        name = self.gpu_names.get(gpu_id) if gpu_id is not None else None
        if name is None and gpu_id is not None:  # disabled, or registered since
            name = await db(_gpu_name)(gpu_id)
        return upstream_auth_headers(name or settings.GPUSCHED_UPSTREAMS[0].name)

    # --- claiming for this process's callers -------------------------------
    def finish_soon(
        self,
        *,
        claim: ClaimedJob,
        answer: UpstreamAnswer | None,
        error: str | None,
        caller_gone: OnCallerGone | None = None,
    ) -> None:
        """End a relayed job while its answer goes out to the caller, and
        claim the GPU for the next of this process's callers if the score
        picks one (the dispatcher, woken by the job's end, claims otherwise).
        The task is this gateway's: the caller hanging up does not cancel it."""
        task = asyncio.get_running_loop().create_task(
            self._finish(claim=claim, answer=answer, error=error, caller_gone=caller_gone)
        )
        self._finishing[claim.job_id] = task
        task.add_done_callback(lambda _: self._finishing.pop(claim.job_id, None))

    def after_caller_left(self, job_id: int, leaving: Coroutine[Any, Any, None]) -> None:
        """Run `leaving` (what becomes of a granted job's request to
        llama-swap once its caller hung up) as this gateway's task: the
        caller's own task is over, and a drain may outlast the server's
        patience with a disconnected request. The job stays held (the GPU
        busy) until `leaving` ends it."""
        task = asyncio.get_running_loop().create_task(leaving)
        self._leaving[job_id] = task

        def left(_: asyncio.Task) -> None:
            self._leaving.pop(job_id, None)
            if job_id not in self._finishing:  # it did not end the job: nothing holds the GPU
                self.held.discard(job_id)

        task.add_done_callback(left)

    def finishing(self, job_id: int) -> bool:
        """Whether `job_id`'s end is being written (finish_soon), or waits
        for its request to llama-swap to be closed or drained."""
        return job_id in self._finishing or job_id in self._leaving

    async def _finish(
        self,
        *,
        claim: ClaimedJob,
        answer: UpstreamAnswer | None,
        error: str | None,
        caller_gone: OnCallerGone | None,
    ) -> None:
        # Claim for this process's callers only when one waits (or is on its
        # way in): an idle GPU is the dispatcher's, and its admission's.
        waiting = self.submitting or any(not f.done() for f in self._waiting.values())
        if answer is not None and 200 <= answer.status_code < 300:
            try:  # before the end: the job still holds the GPU (server_slots.py)
                await server_slots_read(claim, await self.auth_headers(claim.gpu_id), db)
            except Exception:  # never in the way of the job's end
                logger.exception("front door: job %s: its server's slots", claim.job_id)
        give_up_at = time.monotonic() + FINISH_RETRY_SECONDS
        pause = FINISH_RETRY_FIRST_PAUSE
        try:
            while True:
                try:
                    following = await db(job_end_and_grant, gpu_path=True)(
                        claim=claim,
                        answer=answer,
                        error=error,
                        inline_limit=settings.GPUSCHED_RESULT_INLINE_BYTES,
                        gateway=self.number if waiting else None,
                        worker=self.worker,
                        caller_gone=caller_gone,
                    )
                    break
                except DATABASE_ERRORS as exc:
                    # PostgreSQL away (a restart): the caller has its answer;
                    # keep it for the job's record. A retry after a lost
                    # commit changes nothing: the end matches the claim token.
                    if time.monotonic() + pause > give_up_at:
                        raise
                    logger.warning(
                        "front door: job %s: database unavailable, writing its end again "
                        "in %.1f s: %s",
                        claim.job_id,
                        pause,
                        exc,
                    )
                    await asyncio.sleep(pause)
                    pause = min(pause * 2, FINISH_RETRY_MAX_PAUSE)
        except Exception:
            # The lease runs out and recovery ends the job (docs/architecture.md).
            logger.exception("front door: job %s could not be finished", claim.job_id)
            return
        finally:
            self.held.discard(claim.job_id)
        if following is not None:
            self.hand_over(following)

    async def finished(self) -> None:
        """Until every job this process relayed is written as ended, drained
        ones included (tests, a graceful stop)."""
        while self._finishing or self._leaving:
            await asyncio.gather(
                *self._leaving.values(), *self._finishing.values(), return_exceptions=True
            )

    def hand_over(self, claim: ClaimedJob) -> None:
        """A claim made here for one of this process's callers: to that call."""
        self._deliver(claim.job_id, Grant(JobStatus.RUNNING, claim=claim))

    async def stop(self) -> None:
        """Stop listening (tests; a server simply exits)."""
        await self.finished()
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
        job_end_durable(
            claim=ClaimRecord.of_row(job),
            answer=None,
            error=reason,
            inline_limit=0,
            caller_gone=OnCallerGone.CLOSE,
        )


def _enabled_gpus() -> tuple[dict[int, str], dict[int, str], int]:
    """The enabled GPUs' URLs and names by id, and the most jobs a model may
    share one with."""
    slots = ModelSetting.objects.aggregate(most=Max("parallel"))["most"] or 1
    rows = Gpu.objects.filter(enabled=True).values_list("pk", "url", "name")
    return {pk: url for pk, url, _ in rows}, {pk: name for pk, _, name in rows}, slots


def _gpu_name(gpu_id: int) -> str | None:
    return Gpu.objects.filter(pk=gpu_id).values_list("name", flat=True).first()


def _ended_or_granted(job_ids: list[int]) -> list[GatewayNotice]:
    """The notices for those of `job_ids` no longer queued (a notice lost
    while the listener reconnected)."""
    if not job_ids:
        return []
    jobs = (
        Job.objects.filter(pk__in=job_ids)
        .exclude(status=JobStatus.QUEUED)
        .only(*GatewayNotice.JOB_FIELDS)
    )
    return [GatewayNotice.of_job(job) for job in jobs]


gateway = Gateway()
