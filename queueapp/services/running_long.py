"""The holder watchdog: report a job that has held its GPU far past its estimate.

A job that runs past max(3 x its estimate, the policy's
`running_long_min_seconds`) gets one WARNING line in the log of the process
that finds it (the terminal of `make run`), naming the GPU, job, member,
model and minutes held; a `running_long` event; and `running_long_at`, which
the dashboard shows as "running long" on the GPU's card. The rule and its
words: queueapp/policy/running_long.py. Nothing is stopped: a started job
runs to its end (DESIGN.md); the operator decides.

Why a sweep that any process may run, rather than a check by the process
that runs the job: the holder is exactly what may be stuck. So the sweep is
global and a compare-and-set (`running_long_at IS NULL` in the UPDATE that
sets it), and it runs where something already wakes while a GPU is held:
each dispatcher's housekeeping clock, ticking while it waits for a granted
front-door job or a busy GPU, its idle loop (another GPU's job), and its
lease thread while it forwards a job itself (the pass does not tick then);
each web process's front-door
housekeeping while a call it relays holds a GPU (front-door jobs run in web
processes, with no dispatcher forwarding them); and a minute schedule on the
`webhooks` cluster as the safety net. Whichever finds a job first reports
it; the others find it reported. The sweep's first statement filters by
the policy's minimum in SQL, so with no job held that long (the usual case)
it is one index scan of running jobs and nothing more.
"""

from __future__ import annotations

import logging

from django.db import connection, transaction

from queueapp.durations import Durations
from queueapp.live.events import queue_changed
from queueapp.models import Job, JobEvent, JobStatus
from queueapp.policy.running_long import (
    RUNNING_LONG_MIN_SECONDS,
    RunningLong,
    running_long_after,
)
from queueapp.selectors import db_now, policy_get, running_jobs

logger = logging.getLogger(__name__)

# How often each process that sweeps (above) looks: a job is reported within
# about this long of passing its limit.
RUNNING_LONG_CHECK_SECONDS = 2.0


def jobs_report_running_long() -> list[RunningLong]:
    """Report each running job past the watchdog's limit, once per run; the
    ones this call reported (another process may have reported the rest)."""
    with connection.cursor() as cursor:
        # Held past the policy's minimum: no limit is lower (the partial index
        # on running jobs, job_running_lease, keeps this one short scan).
        cursor.execute(
            """
            SELECT job.id FROM queueapp_job AS job
             WHERE job.status = 'running' AND job.running_long_at IS NULL
               AND job.started_at <= now() - make_interval(secs => coalesce(
                   (SELECT running_long_min_seconds FROM queueapp_policy WHERE id = 1), %s))
            """,
            [RUNNING_LONG_MIN_SECONDS],
        )
        held = {row[0] for row in cursor.fetchall()}
    if not held:
        return []
    min_seconds = policy_get().running_long_min_seconds
    durations = Durations.load()
    now = db_now()
    due: dict[int, tuple[Job, RunningLong]] = {}
    for job in running_jobs():
        if job.pk not in held or job.started_at is None:
            continue
        # Its own size, at the concurrency it started with, as the forecast expects its end.
        estimate = durations.job_run_seconds(
            job.model, job.path, job.size, getattr(job, "in_flight", 1)
        )
        found = RunningLong(
            job_id=job.pk,
            gpu=job.gpu.name if job.gpu is not None else "",
            member=job.member.name,
            model=job.model,
            held_seconds=(now - job.started_at).total_seconds(),
            limit_seconds=running_long_after(estimate_seconds=estimate, min_seconds=min_seconds),
            estimate_seconds=estimate,
        )
        if found.held_seconds >= found.limit_seconds:
            due[job.pk] = (job, found)
    if not due:
        return []
    reported: list[RunningLong] = []
    for job, found in due.values():
        # One job's row per transaction: the sweep never holds two row
        # locks, so it cannot deadlock with a recovery or an end.
        with transaction.atomic(durable=True):
            # The same run (its start unchanged), not reported by anyone yet.
            if not Job.objects.filter(
                pk=job.pk,
                status=JobStatus.RUNNING,
                started_at=job.started_at,
                running_long_at__isnull=True,
            ).update(running_long_at=now):
                continue
            JobEvent.objects.create(
                job_id=job.pk, kind=JobEvent.Kind.RUNNING_LONG, detail=found.detail()
            )
            queue_changed(kind=JobEvent.Kind.RUNNING_LONG, job_id=job.pk)
        reported.append(found)
    for found in reported:
        logger.warning(found.message())
    return reported
