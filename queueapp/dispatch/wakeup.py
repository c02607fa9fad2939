"""Waking the GPU worker: a django-q2 task on the "gpu" cluster's queue.

Every submission asks for a dispatch pass after it commits, but a pass that
is waiting in the queue already will see the new job, so a new task is only
enqueued when none is waiting: a burst of 2,000 submissions costs a handful
of tasks, not 2,000. A task that the worker has taken (locked) does not count
as waiting, since it may be about to return.
"""

from __future__ import annotations

import logging
import signal
import threading

from django.utils import timezone

GPU_CLUSTER = "gpu"
DISPATCH_TASK = "queueapp.tasks.dispatch"
WEBHOOK_CLUSTER = "webhooks"
DELIVER_TASK = "queueapp.tasks.deliver_webhooks"

logger = logging.getLogger(__name__)

# Set in a worker process when its cluster is asked to stop: a dispatch pass
# finishes the job in flight and claims no other; a delivery pass stops waiting.
STOP_REQUESTED = threading.Event()


def kick(cluster: str = GPU_CLUSTER, task: str = DISPATCH_TASK) -> None:
    """Enqueue `task` on `cluster` unless one waits there untaken already."""
    from django_q.models import OrmQ
    from django_q.tasks import async_task

    waiting = OrmQ.objects.filter(key=cluster, lock__lte=timezone.now()).exists()
    if not waiting:
        async_task(task, cluster=cluster, task_name=f"{cluster}-pass")


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
            kick()
    except Exception:
        logger.exception("could not enqueue the first dispatch pass")


def connect_cluster_start() -> None:
    from django_q.signals import post_spawn

    post_spawn.connect(_on_worker_spawn, dispatch_uid="gpusched-dispatch-on-spawn")
