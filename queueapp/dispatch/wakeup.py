"""Waking the GPU worker.

A dispatch pass (a django-q2 task on its GPU's cluster, `dispatch-<gpu>`)
stays while there is nothing for its GPU and sleeps on PostgreSQL `LISTEN
gpusched_work` (`WorkListener`): a trigger on the jobs table
(queueapp/sql/job_notify.sql) notifies that channel when a job is queued,
leaves the running state on a GPU (`freed`) or enters it (`granted`), and
`work_available` notifies it for other changes (a policy change, a cancel
that uncovers a new line head, a GPU's models or health); each notice is a
`WorkNotice` (queueapp/job_notices.py). NOTIFY arrives within a
millisecond of the commit, with no poll. While its GPU is busy the pass
wakes only when that GPU is left free (`freed` on it, not followed by
`granted` on it): the other GPUs' traffic costs it nothing.

The connection a pass listens on also holds its GPU's dispatcher lock
(queueapp/liveness.py): the pass lives as long as that connection.

The django-q2 task only has to exist: each change also asks for a pass
after it commits, but a pass that is waiting in the queue already will see
the new job, so a new task is only enqueued when none is waiting: a burst of
2,000 submissions costs a handful of tasks, not 2,000. A task that the
worker has taken (locked) does not count as waiting, since it may be about
to return.
"""

from __future__ import annotations

import logging
import signal
import threading
import time

import psycopg
from django.db import connection, transaction
from django.utils import timezone

from gpusched.upstreams import dispatch_cluster_name
from queueapp.job_notices import WORK_CHANNEL, WorkChange, WorkNotice
from queueapp.live.events import listener_connection_params
from queueapp.locks import DISPATCHER_LOCK_CLASS

DISPATCH_TASK = "queueapp.tasks.dispatch"
WEBHOOK_CLUSTER = "webhooks"
DELIVER_TASK = "queueapp.tasks.deliver_webhooks"

logger = logging.getLogger(__name__)

# Set in a worker process when its cluster is asked to stop: a dispatch pass
# finishes the job in flight and claims no other; a delivery pass stops waiting.
STOP_REQUESTED = threading.Event()


def kick(cluster: str | None = None, task: str = DISPATCH_TASK) -> None:
    """Enqueue `task` on `cluster` unless one waits there untaken already;
    `cluster` None: a dispatch pass on every enabled GPU's cluster."""
    from django_q.models import OrmQ
    from django_q.tasks import async_task

    from queueapp.models import Gpu

    if cluster is None:
        for name in Gpu.objects.filter(enabled=True).values_list("name", flat=True):
            kick(dispatch_cluster_name(name), task)
        return
    waiting = OrmQ.objects.filter(key=cluster, lock__lte=timezone.now()).exists()
    if not waiting:
        async_task(task, cluster=cluster, task_name=f"{cluster}-pass")


# A pass that is running hears the work channel; the task is only a
# fallback for a pass that died, so one process asks for it at most this often.
KICK_INTERVAL_SECONDS = 1.0
_last_kick = -KICK_INTERVAL_SECONDS


def _kick_now_and_then() -> None:
    global _last_kick
    if time.monotonic() - _last_kick >= KICK_INTERVAL_SECONDS:
        _last_kick = time.monotonic()
        kick()


def work_available(*, notified: bool = False) -> None:
    """Call inside the transaction that gives the dispatcher something to do;
    `notified`: the change is one the jobs table's trigger announces already
    (a job queued)."""
    if not notified:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_notify(%s, %s)",
                [WORK_CHANNEL, WorkNotice(change=WorkChange.OTHER).payload()],
            )
    transaction.on_commit(_kick_now_and_then)


class WorkListener:
    """One connection of the dispatch pass, listening on WORK_CHANNEL.

    LISTEN starts before the pass's first claim, so a change committed
    between a claim that found nothing and the wait is never missed: its
    notification waits on this connection.
    """

    def __init__(self, gpu_id: int | None = None) -> None:
        self.gpu_id = gpu_id
        self._connection: psycopg.Connection | None = None

    def _connect(self) -> psycopg.Connection:
        if self._connection is None or self._connection.closed:
            self._connection = psycopg.connect(**listener_connection_params(), autocommit=True)
            if self.gpu_id is not None:
                # Alive for as long as this connection (queueapp/liveness.py);
                # tried: a second dispatcher of one GPU must not hang here.
                self._connection.execute(
                    "SELECT pg_try_advisory_lock(%s, %s)", [DISPATCHER_LOCK_CLASS, self.gpu_id]
                )
            self._connection.execute(f"LISTEN {WORK_CHANNEL}")
        return self._connection

    def start(self) -> None:
        try:
            self._connect()
        except psycopg.Error:
            logger.warning("cannot listen for work; waits fall back to timeouts")

    def wait(self, seconds: float, *, until_freed: bool = False) -> bool:
        """Sleep until work is announced, `seconds` pass, or the cluster stops;
        True when woken by a notification. Every pending notification is
        consumed: one wake-up for a burst.

        `until_freed`: the GPU is busy, so only the GPU left free wakes: a
        job leaving the running state on it (`freed`) with no other
        granted on it after (`granted`; a front-door process
        ends its job and grants the next one in one commit). Jobs queued
        meanwhile are read by the claim that follows anyway. A thousand
        front-door calls then cost the dispatcher nothing while the GPU
        serves them one by one, and other GPUs' jobs cost it nothing."""
        deadline = time.monotonic() + max(0.0, seconds)
        freed = False
        try:
            listener = self._connect()
        except psycopg.Error:
            STOP_REQUESTED.wait(min(seconds, 1.0))
            return False
        try:
            while not STOP_REQUESTED.is_set():
                left = deadline - time.monotonic()
                # A short slice, so that a stop request is seen quickly.
                heard = [
                    notice.payload
                    for notice in listener.notifies(timeout=max(0.0, min(left, 0.25)), stop_after=1)
                ]
                # The rest of a burst is consumed too: one wake-up for it.
                heard += [notice.payload for notice in listener.notifies(timeout=0)]
                if heard and not until_freed:
                    return True
                # In commit order: freed, then granted again, is still busy.
                for payload in heard:
                    try:
                        notice = WorkNotice.parse(payload)
                    except ValueError:
                        # Not the trigger's (a NOTIFY by hand): no reason to
                        # end the pass, nor to think the GPU free.
                        logger.warning("ignored on the work channel: %r", payload)
                        continue
                    if notice.change in (WorkChange.FREED, WorkChange.GRANTED) and (
                        self._is_mine(notice.gpu)
                    ):
                        freed = notice.change == WorkChange.FREED
                if freed:
                    return True
                if left <= 0:
                    return False
        except psycopg.Error:
            self.close()
        return False

    def _is_mine(self, gpu: int | None) -> bool:
        return self.gpu_id is None or gpu == self.gpu_id

    def close(self) -> None:
        if self._connection is not None:
            try:
                self._connection.close()
            except psycopg.Error:
                pass
            self._connection = None


def _on_worker_spawn(sender: object, proc_name: str = "", **kwargs: object) -> None:
    # SIGINT to the cluster's process group (Ctrl-C, or `make run` stopping)
    # stops the main process gracefully and is ignored by django-q2's other
    # processes; in the worker it asks the dispatch pass to stop claiming.
    signal.signal(signal.SIGINT, lambda signum, frame: STOP_REQUESTED.set())
    # A (re)started cluster resumes at once: it re-queues the job of a dead
    # predecessor as soon as that job's lease expires, and drains the queue.
    from django_q.conf import Conf

    try:
        if Conf.CLUSTER_NAME == WEBHOOK_CLUSTER:
            kick(WEBHOOK_CLUSTER, DELIVER_TASK)  # deliveries due after a restart
        else:
            kick(Conf.CLUSTER_NAME)
    except Exception:
        logger.exception("could not enqueue the first dispatch pass")


def connect_cluster_start() -> None:
    from django_q.signals import post_spawn

    post_spawn.connect(_on_worker_spawn, dispatch_uid="gpusched-dispatch-on-spawn")
