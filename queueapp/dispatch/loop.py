"""The dispatch loop that one GPU's single worker runs.

Each GPU has a dispatcher of its own (a django-q2 cluster, `dispatch-<gpu>`,
started with GPUSCHED_GPU naming it), claiming from the one queue. One
pass: recover dead leases, ask the GPU's llama-swap what is resident (not
right after a job it answered, which says so; and, now and then, which
models it serves), claim the best job it can run,
forward it with the lease renewed by a heartbeat thread, store the
answer, and claim the next job at once. A front-door job is granted, not
forwarded: its caller's web process makes the call, and the pass waits for
the notification that the job ended. When nothing is queued (or dispatch is
paused) the django-q2 task's pass sleeps until work is announced
(wakeup.WorkListener); a pass called directly (tests) ends instead. A pass
also ends when its time budget is spent (then it hands over to a new task so
django-q2's task timeout stays meaningful), and when its cluster is asked to
stop (wakeup.STOP_REQUESTED): it finishes the job in flight, claims none in
that job's end, and returns to the queue a job claimed but not yet sent, so
a stop fails no job (`make run` stops llama-swap's simulators only after).

The job row, not the django-q2 task, is the truth about what runs: a task
re-delivered while a pass still runs is harmless (the claim's guards keep
one job per GPU slot), and an every-minute schedule (migration 0002) only
restarts a pass that died. `Dispatcher.tick` does one step and returns the
`Wait` before the next (Celery beat's shape); housekeeping (recovery,
callers gone, the holder watchdog, the models llama-swap serves) runs on
its own `Every` clocks. The wait-bound sweep runs beside a job (the
heartbeat's thread) and while idle, not between two jobs: there `decide`
keeps an overdue head off the GPU, and a claim that finds only overdue
heads expires them (`HeadsOverdue`). The holder watchdog also runs beside a
long job and while idle: a job runs long while a GPU is busy, and the
busy GPU may be another dispatcher's or a web process's (the watchdog's
why: queueapp/services/running_long.py).

PostgreSQL away (a restart, a failover) does not end the pass: it backs off
and claims again once the server is back, without waiting for that
schedule. An answer llama-swap already gave is kept in memory and its write
retried (`_until_database_answers`), so the job is stored once, never run
again; a lease renewal matches only the claim token, so a lease that ran
out while nobody could read it is renewed when the database returns.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal, TypeVar

from django.conf import settings
from django.db import close_old_connections, connection

from gpusched.upstreams import dispatch_cluster_name
from queueapp import services
from queueapp.dispatch import wakeup
from queueapp.dispatch.claim import (
    CallersGone,
    ClaimedJob,
    ClaimOutcome,
    GpuBusy,
    HeadsOverdue,
    NoClaim,
    job_claim_next,
)
from queueapp.dispatch.lease import (
    job_end_and_claim_next,
    job_end_durable,
    job_fail_gone_caller,
    job_lease_renew,
    job_return_to_queue,
    jobs_recover_expired,
    lease_renew_interval,
)
from queueapp.dispatch.wakeup import STOP_REQUESTED, WorkListener
from queueapp.errors import DATABASE_ERRORS
from queueapp.models import Gpu, Job, JobStatus
from queueapp.services.running_long import RUNNING_LONG_CHECK_SECONDS
from queueapp.upstream.client import (
    LlamaSwapClient,
    UpstreamAnswer,
    UpstreamBroken,
    UpstreamUnreachable,
    is_preload,
    preload_answer,
)

logger = logging.getLogger(__name__)
T = TypeVar("T")


BACKOFF_FIRST_SECONDS = 0.5
RECOVERY_INTERVAL_SECONDS = 5.0
# How often queued front-door jobs are checked for a caller whose web process
# died, and a granted one's process for being alive: a dead web process costs
# the GPU at most about this long (plus the claim).
CALLER_CHECK_SECONDS = 0.5
BACKOFF_MAX_SECONDS = 30.0
# How often the models llama-swap serves (GET /v1/models) are read again: a
# changed config is seen within this long.
MODELS_CHECK_SECONDS = 30.0
# How long a finished job's answer is kept in memory while PostgreSQL is away
# (a restart, a failover) before the pass gives up on storing it.
DATABASE_OUTAGE_MAX_SECONDS = 600.0
# Why a job claimed but not yet sent went back to the queue.
STOPPING_REASON = "the dispatcher is stopping"


@dataclass
class PassReport:
    dispatched: list[int] = field(default_factory=list)
    returned: int = 0
    ended_because: str = ""

    def summary(self) -> str:
        return (
            f"dispatched {len(self.dispatched)} job(s), returned {self.returned} to the "
            f"queue; stopped: {self.ended_because}"
        )


@dataclass(frozen=True)
class Refused:
    """llama-swap did not take a job's body (unreachable, or busy with
    another client: 429), so the job went back to the queue."""

    retry_after: float | None  # its Retry-After; None: back off


class Heartbeat:
    """Renews the leases of the claims its caller has in flight (every
    `lease_renew_interval`) while their calls run, on a thread and a
    database connection of its own: the job in the pass (`Heartbeat.of`),
    or every job in a shared slot at once (`SharedSlots`). With
    `check_callers`, it also cancels, every CALLER_CHECK_SECONDS, queued
    front-door jobs whose web process died, while the pass itself waits on
    a long job."""

    def __init__(
        self, claims: Callable[[], list[ClaimedJob]], *, check_callers: bool, name: str
    ) -> None:
        self._claims = claims
        self._check_callers = check_callers
        self._lost: set[str] = set()  # claim tokens whose lease another took
        # The pass does not tick while it forwards a job: its watchdog runs here.
        self._running_long = Every(RUNNING_LONG_CHECK_SECONDS, services.jobs_report_running_long)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    @classmethod
    def of(cls, claim: ClaimedJob) -> Heartbeat:
        return cls(lambda: [claim], check_callers=True, name=f"lease-{claim.job_id}")

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()

    def _interval(self) -> float:
        seconds = min((claim.lease_seconds for claim in self._claims()), default=0.0)
        return lease_renew_interval(seconds) if seconds else CALLER_CHECK_SECONDS

    def _run(self) -> None:
        interval = self._interval()
        renew_at = time.monotonic() + interval
        wait = min(interval, CALLER_CHECK_SECONDS) if self._check_callers else interval
        try:
            while not self._stop.wait(wait):
                try:
                    if self._check_callers:
                        services.front_door_orphans_cancel()
                        services.jobs_expire_overdue()
                    self._running_long()
                    if time.monotonic() < renew_at:
                        continue
                    renew_at = time.monotonic() + interval
                    for claim in self._claims():
                        if claim.claim_token in self._lost:
                            continue
                        if not job_lease_renew(claim=claim):
                            logger.warning("job %s: lease lost during the call", claim.job_id)
                            self._lost.add(claim.claim_token)
                except Exception:  # the database may be restarting; keep trying
                    logger.exception("lease renewal failed")
                    close_old_connections()
        finally:
            connection.close()  # this thread's own connection


class GpuStateRecorder:
    """Keeps the GPU's row current with what its llama-swap says, writing
    only when that changes."""

    def __init__(self, gpu_id: int) -> None:
        self.gpu_id = gpu_id
        self._last: tuple[bool, str | None, tuple[str, ...] | None] | None = None
        self._just_loaded: str | None = None
        # The pass and the threads of its shared slots record.
        self._lock = threading.RLock()

    def loaded(self, model: str) -> None:
        """llama-swap just answered a job of `model`: it has it loaded, and
        the next claim may take that from here instead of asking again."""
        with self._lock:
            self.record(reachable=True, resident=model)
            self._just_loaded = model

    def take_just_loaded(self) -> str | None:
        """The model a job just ran with, once; None: ask llama-swap."""
        with self._lock:
            model, self._just_loaded = self._just_loaded, None
            return model

    def forget(self) -> None:
        """The last write may have been lost (database outage): write the next."""
        with self._lock:
            self._last = None

    def record(
        self,
        *,
        reachable: bool,
        resident: str | None,
        error: str = "",
        served_models: list[str] | None = None,
    ) -> None:
        """`served_models` None: not read this time (the last list stands)."""
        with self._lock:
            self._record(
                reachable=reachable, resident=resident, error=error, served_models=served_models
            )

    def _record(
        self,
        *,
        reachable: bool,
        resident: str | None,
        error: str,
        served_models: list[str] | None,
    ) -> None:
        served = tuple(sorted(set(served_models))) if served_models is not None else None
        if served is None and self._last is not None:
            served = self._last[2]
        if self._last == (reachable, resident, served):
            return
        # Jobs may have waited for this GPU to come back or to serve a model:
        # the other dispatchers and admissions hear of it; a new resident
        # model alone changes nothing they could do.
        new_work = (
            self._last is None or (reachable and not self._last[0]) or served != self._last[2]
        )
        self._last = (reachable, resident, served)
        services.gpu_state_record(
            gpu_id=self.gpu_id,
            reachable=reachable,
            resident_model=resident,
            error=error,
            served_models=served_models,
            announce_work=new_work,
        )


class SharedSlots:
    """The jobs a pass runs side by side on its GPU, one thread each: jobs
    of a model whose `parallel` lets several share the GPU. The pass goes
    on claiming while they run; each thread forwards its job and ends it,
    and the end's notice (`freed <gpu>`) wakes the pass for the slot it
    frees. One more thread renews all their leases, on one connection, so
    a slot costs a database connection only while its end is written. A
    job of a one-at-a-time model runs in the pass itself, as it always did."""

    def __init__(self, run: Callable[[ClaimedJob], Refused | None]) -> None:
        self._run = run
        self._in_flight: dict[int, tuple[ClaimedJob, threading.Thread]] = {}  # by job id
        self._lock = threading.Lock()
        # The lease thread, entered with the first job and left when none is in flight.
        self._leases: contextlib.ExitStack | None = None
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
                self._leases = contextlib.ExitStack()
                self._leases.enter_context(
                    Heartbeat(self._claims, check_callers=False, name="slot-leases")
                )
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
            self._leases.close()
            self._leases = None


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True)
class Wait:
    """What a pass does between two ticks."""

    seconds: float
    # "pause": sleep (a stop ends it early); "work": idle until work is
    # announced (queued front-door callers are checked meanwhile); "freed":
    # until a job on this GPU ends, or `seconds`.
    until: Literal["pause", "work", "freed"] = "pause"


class Every:
    """An action run at most every `seconds` (time.monotonic), on the tick
    that finds it due: the pass's housekeeping clocks."""

    def __init__(self, seconds: float, action: Callable[[], object] | None = None) -> None:
        self.seconds = seconds
        self.action = action
        self._last = -math.inf

    def __call__(self) -> None:
        if self.action is not None and self.due():
            self.action()
            self._last = time.monotonic()

    def due(self) -> bool:
        return time.monotonic() - self._last >= self.seconds

    def done(self) -> None:
        """Ran now, by its caller."""
        self._last = time.monotonic()

    def now(self) -> None:
        """Due at the next tick."""
        self._last = -math.inf


class Dispatcher:
    """One GPU's pass, a tick at a time (Celery beat's `tick()`): each tick
    runs the housekeeping that is due, claims (or takes the job claimed in
    the commit that ended the last), runs what it claimed, and says how
    long to wait; `run_pass` owns the waiting."""

    def __init__(self, gpu: Gpu, *, deadline: float, wait_when_idle: bool) -> None:
        self.gpu = gpu
        self.deadline = deadline
        self.wait_when_idle = wait_when_idle
        self.client = LlamaSwapClient(gpu.url, job_timeout=settings.GPUSCHED_JOB_TIMEOUT)
        self.report = PassReport()
        self.gpu_state = GpuStateRecorder(gpu.pk)
        self.worker = worker_name()
        self.backoff = BACKOFF_FIRST_SECONDS
        # Expired leases only exist after a dispatcher died, so recovery
        # runs at the start of a pass and now and then, not per job.
        self.recovery = Every(RECOVERY_INTERVAL_SECONDS, jobs_recover_expired)
        self.caller_check = Every(CALLER_CHECK_SECONDS, services.front_door_orphans_cancel)
        self.models_read = Every(MODELS_CHECK_SECONDS)
        self.running_long = Every(RUNNING_LONG_CHECK_SECONDS, services.jobs_report_running_long)
        self.work = WorkListener(gpu.pk)
        self.work.start()  # before the first claim: nothing committed after it is missed
        # The next job, claimed in the commit that ended the last one.
        self.following: ClaimedJob | None = None
        self.slots = SharedSlots(self._run_in_slot)

    def close(self) -> None:
        self.slots.wait_all()  # the jobs in flight end before the pass does
        self.work.close()
        self.client.close()

    def _end(self, because: str) -> None:
        self.report.ended_because = because

    def _back_off(self, seconds: float | None = None) -> Wait:
        wait = Wait(self.backoff if seconds is None else seconds)
        self.backoff = min(self.backoff * 2, BACKOFF_MAX_SECONDS)
        return wait

    def tick(self) -> Wait | None:
        """One step; the wait before the next, or None when the pass ends
        (`report.ended_because` says why)."""
        if STOP_REQUESTED.is_set():
            # A job claimed in the commit that ended the last one has not
            # reached llama-swap yet: it goes back to its place, so that a
            # stop (and the simulators `make run` stops after the
            # dispatchers) never fails it.
            if self.following is not None:
                self._return_for_stop(self.following)
                self.following = None
            self._end("cluster stopping")
            return None
        if self.following is None and time.monotonic() >= self.deadline:
            self._end("time budget spent")
            # A fresh task goes on where this one stops.
            wakeup.kick(dispatch_cluster_name(self.gpu.name))
            return None
        try:
            return self._step()
        except Gpu.DoesNotExist:
            # The GPU's row was deleted (in the admin): a new pass
            # registers it again, with a listener on its new id.
            self._end("the GPU's row was deleted; registering it again")
            wakeup.kick(dispatch_cluster_name(self.gpu.name))
            return None
        except DATABASE_ERRORS as exc:
            # PostgreSQL is restarting: wait for it in this pass rather
            # than end it, so the queue goes on as soon as it is back.
            logger.warning("database unavailable, retrying in %.1f s: %s", self.backoff, exc)
            self.gpu_state.forget()
            close_old_connections()
            return self._back_off()

    def _step(self) -> Wait | None:
        self.recovery()
        self.caller_check()
        self.running_long()
        outcome: ClaimOutcome | Wait | None = self.following
        self.following = None
        if outcome is not None:
            self.gpu_state.take_just_loaded()  # what it runs with is in its decision
        else:
            if time.monotonic() < self.slots.hold_off_until:
                return Wait(self.slots.hold_off_until - time.monotonic())
            outcome = self._claim()
        if outcome is None or isinstance(outcome, Wait):
            return outcome
        if isinstance(outcome, ClaimedJob):
            return self._run(outcome)
        return self._not_claimed(outcome)

    def _claim(self) -> ClaimOutcome | Wait | None:
        """Ask llama-swap what it has loaded, then claim."""
        try:
            # Between two jobs of a backlog, the one that just ended says
            # what is loaded: one HTTP call fewer per job; so do the jobs
            # in flight in shared slots.
            resident = (
                self.gpu_state.take_just_loaded()
                or self.slots.in_flight_model
                or self.client.resident_model()
            )
            served = None
            if self.models_read.due():
                served = self.client.served_models()
                self.models_read.done()
        except UpstreamUnreachable as exc:
            self.gpu_state.record(reachable=False, resident=None, error=str(exc))
            if Job.objects.filter(status=JobStatus.QUEUED).exists():
                logger.warning("llama-swap unreachable, retrying in %.1f s: %s", self.backoff, exc)
                return self._back_off()
            return self._idle("queue empty (llama-swap unreachable)")
        self.gpu_state.record(reachable=True, resident=resident, served_models=served)
        return job_claim_next(resident_model=resident, worker=self.worker, gpu=self.gpu.pk)

    def _idle(self, because: str) -> Wait | None:
        if not self.wait_when_idle:
            self._end(because)
            return None
        return Wait(self.deadline - time.monotonic(), until="work")

    def _not_claimed(self, outcome: GpuBusy | CallersGone | HeadsOverdue | NoClaim) -> Wait | None:
        if isinstance(outcome, NoClaim):
            return self._idle(f"nothing to claim: {outcome.reason}")
        if isinstance(outcome, CallersGone):
            services.front_door_orphans_cancel()
            return Wait(0.0)
        if isinstance(outcome, HeadsOverdue):
            services.jobs_expire_overdue()
            return Wait(0.0)
        if outcome.caller_gone:
            job_fail_gone_caller(job_id=outcome.job_id)
            return Wait(0.0)
        # A granted front-door job, or another dispatcher's (or a dead
        # one's): its end is announced on the work channel, or its lease
        # expires and the recovery re-queues it.
        if outcome.seconds_left <= CALLER_CHECK_SECONDS:
            self.recovery.now()
        return Wait(min(outcome.seconds_left + 0.05, CALLER_CHECK_SECONDS), until="freed")

    def _return_for_stop(self, claim: ClaimedJob) -> None:
        """Undo a claim whose body was never sent, the cluster stopping; a
        granted job is its caller's to run."""
        if claim.granted:
            return
        _until_database_answers(
            lambda: job_return_to_queue(claim=claim, reason=STOPPING_REASON), claim=claim
        )
        self.report.returned += 1

    def _run(self, claim: ClaimedJob) -> Wait | None:
        if STOP_REQUESTED.is_set() and not claim.granted:
            # Claimed as the stop came: not sent, so not run.
            self._return_for_stop(claim)
            self._end("cluster stopping")
            return None
        if claim.shared and not claim.granted:
            # Its model's jobs share the GPU: run it beside the others and
            # claim the next free slot at once.
            self.slots.start(claim)
            return Wait(0.0)
        ran = self._forward(claim, claim_next=_may_go_on(self.deadline))
        if isinstance(ran, Refused):
            return self._back_off(ran.retry_after)
        self.following = ran
        self.backoff = BACKOFF_FIRST_SECONDS
        return Wait(0.0)

    def _run_in_slot(self, claim: ClaimedJob) -> Refused | None:
        # SharedSlots renews the leases of all of them.
        ran = self._forward(claim, claim_next=False, heartbeat=False)
        return ran if isinstance(ran, Refused) else None

    def _forward(
        self, claim: ClaimedJob, *, claim_next: bool, heartbeat: bool = True
    ) -> Refused | ClaimedJob | None:
        return _run_claimed(
            self.client,
            claim,
            self.report,
            self.gpu_state,
            worker=self.worker,
            claim_next=claim_next,
            heartbeat=heartbeat,
        )

    def wait(self, wait: Wait) -> None:
        if wait.until == "work":
            _sleep_until_work(self.work, self.deadline, running_long=self.running_long)
        elif wait.until == "freed":
            self.work.wait(wait.seconds, until_freed=True)
        elif wait.seconds > 0:
            _pause(wait.seconds, self.deadline)


def run_pass(
    *, budget_seconds: float | None = None, wait_when_idle: bool = False, gpu: str | None = None
) -> PassReport:
    """Dispatch for GPU `gpu` (a name of LLAMA_SWAP_URL; None: GPUSCHED_GPU)
    until nothing is left for it (or, `wait_when_idle`, until the budget is
    spent, sleeping on the work channel while idle)."""
    budget = settings.GPUSCHED_DISPATCH_BUDGET if budget_seconds is None else budget_seconds
    dispatcher = Dispatcher(
        services.gpu_configured(gpu),
        deadline=time.monotonic() + budget,
        wait_when_idle=wait_when_idle,
    )
    try:
        while (wait := dispatcher.tick()) is not None:
            dispatcher.wait(wait)
        return dispatcher.report
    finally:
        dispatcher.close()


def _may_go_on(deadline: float) -> bool:
    """Whether the pass may claim another job: not stopping, budget left."""
    return not STOP_REQUESTED.is_set() and time.monotonic() < deadline


def _run_claimed(
    client: LlamaSwapClient,
    claim: ClaimedJob,
    report: PassReport,
    gpu_state: GpuStateRecorder,
    *,
    worker: str,
    claim_next: bool,
    heartbeat: bool = True,
) -> Refused | ClaimedJob | None:
    """Forward one claimed job. `Refused` when llama-swap did not take it
    (the job went back to the queue); with `claim_next`, the next job when
    it was claimed in the commit that ended this one (after an answer,
    llama-swap has the job's model loaded: the next claim needs no GET
    /running)."""
    if claim.granted:
        # The caller's web process makes the call; the next claim finds the
        # GPU busy and waits for the job's end on the work channel.
        report.dispatched.append(claim.job_id)
        return None
    answer: UpstreamAnswer | None = None
    error: str | None = None
    if is_preload(claim.path) and claim.swap_needed is False:
        # A preload of the model llama-swap has ready: it ends at once, no call.
        answer = preload_answer(claim.model, upstream_status=None)
    else:
        with Heartbeat.of(claim) if heartbeat else contextlib.nullcontext():
            try:
                answer = _call_upstream(client, claim)
            except UpstreamUnreachable as exc:
                reason = str(exc)
                _until_database_answers(
                    lambda: job_return_to_queue(claim=claim, reason=reason), claim=claim
                )
                report.returned += 1
                return Refused(retry_after=None)
            except UpstreamBroken as exc:
                error = str(exc)
    if answer is not None and answer.is_busy:
        # llama-swap's own concurrency limit, hit by another client: the body
        # was refused, not run, so the job keeps its place.
        _until_database_answers(
            lambda: job_return_to_queue(claim=claim, reason="llama-swap busy (429)"), claim=claim
        )
        report.returned += 1
        return Refused(retry_after=min(max(answer.retry_after or 1.0, 0.1), BACKOFF_MAX_SECONDS))
    answered = answer is not None and 200 <= answer.status_code < 300

    def end() -> ClaimedJob | None:
        # Read at the end, not when the call began: a stop that came during
        # the call claims nothing more.
        if answered and claim_next and not STOP_REQUESTED.is_set():
            return job_end_and_claim_next(
                claim=claim,
                answer=answer,
                error=error,
                inline_limit=settings.GPUSCHED_RESULT_INLINE_BYTES,
                resident_model=claim.model,
                worker=worker,
            )
        job_end_durable(
            claim=claim,
            answer=answer,
            error=error,
            inline_limit=settings.GPUSCHED_RESULT_INLINE_BYTES,
        )
        return None

    following = _until_database_answers(end, claim=claim)
    report.dispatched.append(claim.job_id)
    if answered:
        # llama-swap has this model loaded now; the queue view scores
        # affinity by it until the next probe.
        gpu_state.loaded(claim.model)
    return following


def _call_upstream(client: LlamaSwapClient, claim: ClaimedJob) -> UpstreamAnswer:
    """The job's call: its body posted to its path, or its model loaded (a preload)."""
    if is_preload(claim.path):
        return client.preload(claim.model)
    return client.forward(claim.path, claim.body)


def _until_database_answers(write: Callable[[], T], *, claim: ClaimedJob) -> T:
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


def _sleep_until_work(work: WorkListener, deadline: float, *, running_long: Every) -> None:
    """Idle: wait for the work channel, checking queued front-door callers
    (and, on its clock, the jobs other GPUs run: `running_long`) meanwhile;
    returns to claim when woken, or at the deadline or a stop."""
    while time.monotonic() < deadline and not STOP_REQUESTED.is_set():
        if work.wait(min(CALLER_CHECK_SECONDS, deadline - time.monotonic())):
            return
        services.front_door_orphans_cancel()
        services.jobs_expire_overdue()
        running_long()


def _pause(seconds: float, deadline: float) -> None:
    STOP_REQUESTED.wait(max(0.0, min(seconds, deadline - time.monotonic())))
