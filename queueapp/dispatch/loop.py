"""The dispatch loop that one GPU's single worker runs.

Each GPU has a dispatcher of its own (a django-q2 cluster, `dispatch-<gpu>`,
started with GPUSCHED_GPU naming it), claiming from the one queue. One
pass: run the housekeeping that is due, ask the GPU's llama-swap what is
resident (not right after a job it answered, which says so; and, now and
then, which models it serves: queueapp/dispatch/gpu_state.py), claim the
best job it can run, forward it and store the answer
(queueapp/dispatch/forwarding.py), and claim the next job at once. A job
of a model whose slots are shared runs beside the pass
(queueapp/dispatch/shared_slots.py). A front-door job is granted, not
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
restarts a pass that died. `Dispatcher.tick` does one step and says what
comes next (Celery beat's shape): a `Wait` before the next step, or `Ended`
with the reason the pass ends. Its first step is the housekeeping
(`Housekeeping.sweep`, queueapp/dispatch/housekeeping.py, which says which
sweeps run where and why); the models llama-swap serves are read on their
own `Every` clock with the question of what is resident. PostgreSQL away
does not end the pass: it backs off and claims again once the server is
back (queueapp/dispatch/database_retry.py).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from dataclasses import dataclass
from typing import Literal

from django.conf import settings
from django.db import close_old_connections

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
from queueapp.dispatch.database_retry import BACKOFF_FIRST_SECONDS, BACKOFF_MAX_SECONDS
from queueapp.dispatch.forwarding import PassReport, Refused, return_to_queue, run_claimed
from queueapp.dispatch.gpu_state import GpuStateRecorder
from queueapp.dispatch.housekeeping import CALLER_CHECK_SECONDS, Every, Housekeeping, Moment
from queueapp.dispatch.lease import job_fail_gone_caller
from queueapp.dispatch.routing_file import RoutingFile
from queueapp.dispatch.shared_slots import SharedSlots
from queueapp.dispatch.upstream_watch import UpstreamWatch
from queueapp.dispatch.wakeup import STOP_REQUESTED, WorkListener
from queueapp.errors import DATABASE_ERRORS
from queueapp.models import Gpu, Job, JobStatus
from queueapp.upstream.client import LlamaSwapClient, UpstreamUnreachable, upstream_auth_headers

logger = logging.getLogger(__name__)


# How often the models llama-swap serves (GET /v1/models) are read again: a
# changed config is seen within this long.
MODELS_CHECK_SECONDS = 30.0
# Why a job claimed but not yet sent went back to the queue.
STOPPING_REASON = "the dispatcher is stopping"


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True)
class Wait:
    """What a pass does between two ticks."""

    seconds: float
    # "pause": sleep (a stop ends it early); "work": idle until work is
    # announced (queued front-door callers are checked meanwhile); "freed":
    # until a job on this GPU ends, or `seconds`; "notice": until any
    # notice of work or of a job's end, or `seconds`.
    until: Literal["pause", "work", "freed", "notice"] = "pause"


@dataclass(frozen=True)
class Ended:
    """The pass ends after this tick, and why (also its report's `ended_because`)."""

    because: str


class Dispatcher:
    """One GPU's pass, a tick at a time (Celery beat's `tick()`): each tick
    runs the housekeeping that is due, claims (or takes the job claimed in
    the commit that ended the last), runs what it claimed, and says what
    comes next: how long to `Wait`, or that the pass `Ended` and why;
    `run_pass` owns the waiting."""

    def __init__(self, gpu: Gpu, *, deadline: float, wait_when_idle: bool) -> None:
        self.gpu = gpu
        self.deadline = deadline
        self.wait_when_idle = wait_when_idle
        self.client = self._new_client()
        self.report = PassReport()
        self.gpu_state = GpuStateRecorder(gpu.pk, gpu_name=gpu.name)
        self.worker = worker_name()
        self.backoff = BACKOFF_FIRST_SECONDS
        # llama-swap's config file: its routing, recorded on the GPU's row.
        self.routing_file = RoutingFile(gpu, settings.LLAMA_SWAP_CONFIGS.path_for(gpu.name))
        self.housekeeping = Housekeeping(routing_check=self.routing_file.check)
        self.models_read = Every(MODELS_CHECK_SECONDS)
        self.work = WorkListener(gpu.pk)
        self.work.start()  # before the first claim: nothing committed after it is missed
        # The next job, claimed in the commit that ended the last one.
        self.following: ClaimedJob | None = None
        self.slots = SharedSlots(self._run_in_slot)
        # A dispatcher's pass follows llama-swap between claims; a pass
        # called directly (tests) reads it before each claim only.
        self.watch: UpstreamWatch | None = None
        if wait_when_idle:
            self.watch = UpstreamWatch(self._new_client, self.gpu_state)
            self.watch.start()

    def _new_client(self) -> LlamaSwapClient:
        return LlamaSwapClient(
            self.gpu.url,
            job_timeout=settings.GPUSCHED_JOB_TIMEOUT,
            auth_headers=upstream_auth_headers(self.gpu.name),
        )

    def close(self) -> None:
        self.slots.wait_all()  # the jobs in flight end before the pass does
        if self.watch is not None:
            self.watch.close()
        self.work.close()
        self.client.close()

    def _end(self, because: str) -> Ended:
        self.report.ended_because = because
        return Ended(because)

    def _back_off(self, seconds: float | None = None) -> Wait:
        wait = Wait(self.backoff if seconds is None else seconds)
        self.backoff = min(self.backoff * 2, BACKOFF_MAX_SECONDS)
        return wait

    def tick(self) -> Wait | Ended:
        """One step; the wait before the next, or why the pass ends."""
        if STOP_REQUESTED.is_set():
            # A job claimed in the commit that ended the last one has not
            # reached llama-swap yet: it goes back to its place, so that a
            # stop (and the simulators `make run` stops after the
            # dispatchers) never fails it.
            if self.following is not None:
                self._return_for_stop(self.following)
                self.following = None
            return self._end("cluster stopping")
        if self.following is None and time.monotonic() >= self.deadline:
            ended = self._end("time budget spent")
            # A fresh task goes on where this one stops.
            wakeup.kick(dispatch_cluster_name(self.gpu.name))
            return ended
        try:
            return self._step()
        except Gpu.DoesNotExist:
            # The GPU's row was deleted (in the admin): a new pass
            # registers it again, with a listener on its new id.
            ended = self._end("the GPU's row was deleted; registering it again")
            wakeup.kick(dispatch_cluster_name(self.gpu.name))
            return ended
        except DATABASE_ERRORS as exc:
            # PostgreSQL is restarting: wait for it in this pass rather
            # than end it, so the queue goes on as soon as it is back.
            logger.warning("database unavailable, retrying in %.1f s: %s", self.backoff, exc)
            self.gpu_state.forget()
            close_old_connections()
            return self._back_off()

    def _step(self) -> Wait | Ended:
        self.housekeeping.sweep(Moment.BETWEEN_JOBS)
        if self.following is not None:
            claim, self.following = self.following, None
            self.gpu_state.take_just_loaded()  # what it runs with is in its decision
            return self._run(claim)
        if time.monotonic() < self.slots.hold_off_until:
            return Wait(self.slots.hold_off_until - time.monotonic())
        outcome = self._claim()
        if isinstance(outcome, Wait | Ended):
            return outcome
        if isinstance(outcome, ClaimedJob):
            return self._run(outcome)
        return self._not_claimed(outcome)

    def _claim(self) -> ClaimOutcome | Wait | Ended:
        """Ask llama-swap what it has loaded, then claim."""
        try:
            # Between two jobs of a backlog, the one that just ended says
            # what is loaded: one HTTP call fewer per job; so do the jobs
            # in flight in shared slots.
            answered = self.gpu_state.take_just_loaded()
            # A model with jobs in flight here is the one the claim keeps,
            # but it may still be loading: only an answer says it is ready.
            resident = answered or self.slots.in_flight_model
            if resident is None:
                resident = self.gpu_state.running_read(self.client.running_states())
            served = None
            if self.models_read.due():
                served = self.client.served_models()
                self.models_read.done()
        except UpstreamUnreachable as exc:
            self.gpu_state.record(reachable=False, resident=None, error=str(exc))
            if Job.objects.filter(status=JobStatus.QUEUED).exists():
                logger.warning("%s; retrying in %.1f s", exc, self.backoff)
                return self._back_off()
            return self._idle("queue empty (llama-swap unreachable)")
        self.gpu_state.record(reachable=True, resident=answered, served_models=served)
        return job_claim_next(resident_model=resident, worker=self.worker, gpu=self.gpu.pk)

    def _idle(self, because: str) -> Wait | Ended:
        if not self.wait_when_idle:
            return self._end(because)
        return Wait(self.deadline - time.monotonic(), until="work")

    def _not_claimed(self, outcome: GpuBusy | CallersGone | HeadsOverdue | NoClaim) -> Wait | Ended:
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
            self.housekeeping.recovery.now()
        return Wait(
            min(outcome.seconds_left + 0.05, CALLER_CHECK_SECONDS),
            until="notice" if outcome.wake_on_work else "freed",
        )

    def _return_for_stop(self, claim: ClaimedJob) -> None:
        """Undo a claim whose body was never sent, the cluster stopping; a
        granted job is its caller's to run."""
        if claim.granted:
            return
        return_to_queue(claim=claim, reason=STOPPING_REASON, report=self.report)

    def _run(self, claim: ClaimedJob) -> Wait | Ended:
        if STOP_REQUESTED.is_set() and not claim.granted:
            # Claimed as the stop came: not sent, so not run.
            self._return_for_stop(claim)
            return self._end("cluster stopping")
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
        return run_claimed(
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
            _sleep_until_work(self.work, self.deadline, self.housekeeping)
        elif wait.until == "freed":
            self.work.wait(wait.seconds, until_freed=True)
        elif wait.until == "notice":
            self.work.wait(wait.seconds)
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
        while isinstance(step := dispatcher.tick(), Wait):
            dispatcher.wait(step)
        return dispatcher.report
    finally:
        dispatcher.close()


def _may_go_on(deadline: float) -> bool:
    """Whether the pass may claim another job: not stopping, budget left."""
    return not STOP_REQUESTED.is_set() and time.monotonic() < deadline


def _sleep_until_work(work: WorkListener, deadline: float, housekeeping: Housekeeping) -> None:
    """Idle: wait for the work channel, sweeping meanwhile (queued front-door
    callers, overdue jobs, and on its clock the jobs other GPUs run);
    returns to claim when woken, or at the deadline or a stop."""
    while time.monotonic() < deadline and not STOP_REQUESTED.is_set():
        if work.wait(min(CALLER_CHECK_SECONDS, deadline - time.monotonic())):
            return
        housekeeping.sweep(Moment.WAITING)


def _pause(seconds: float, deadline: float) -> None:
    STOP_REQUESTED.wait(max(0.0, min(seconds, deadline - time.monotonic())))
