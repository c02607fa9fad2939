"""Retention (writes): finished jobs leave the database after a while.

The claim and the queue only read queued lines' heads through partial
indexes, so old rows do not slow them; pruning keeps the tables, their
full indexes (primary key, member, finished_at) and backups bounded.
`manage.py prune_jobs` and the daily task (migration 0010) call `jobs_prune`.

Deleted, not archived: nothing in gpusched reads old jobs, and an archive
would be a second copy to bound. Kept: queued and running jobs, a job whose
webhook delivery is still pending, and the finished units of a chain that
still has work (`_PRUNABLE` says why). `RunStats` and the lane clocks hold
no job reference, so estimates and fair share do not change with a prune;
what the period bounds is how far back `/api/stats/?window=all`, a job's
`why` and the admin's history reach.

Each batch is one statement in a short transaction of its own that skips
rows another holds (SKIP LOCKED), so submissions, claims and cancels never
wait behind a prune. The daily pass runs on the `webhooks` cluster (never
behind a GPU job) and goes on in a new task when its time is up. Deleted
rows leave space autovacuum reuses: the files stop growing, they do not
shrink (that needs VACUUM FULL, which locks the table).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime

from django.db import connection, transaction

from queueapp.models import JobStatus

FINISHED_STATUSES = (
    JobStatus.SUCCEEDED,
    JobStatus.FAILED,
    JobStatus.CANCELLED,
    JobStatus.EXPIRED,
)
PRUNE_BATCH_SIZE = 2000

# Finished before the cutoff, and nothing still needs the row: no webhook
# delivery still pending (its retries read the job), no unit of the same
# chain queued or running (chain progress counts the finished units).
_PRUNABLE = """
    SELECT job.id, job.result_file FROM queueapp_job AS job
     WHERE job.status IN ('succeeded', 'failed', 'cancelled', 'expired')
       AND job.finished_at < %(before)s
       AND NOT EXISTS (
           SELECT 1 FROM queueapp_webhookdelivery AS delivery
            WHERE delivery.job_id = job.id AND delivery.status = 'pending')
       AND NOT (job.chain_id <> '' AND EXISTS (
           SELECT 1 FROM queueapp_job AS unit
            WHERE unit.member_id = job.member_id AND unit.chain_id = job.chain_id
              AND unit.status IN ('queued', 'running')))
"""


@dataclass(frozen=True)
class PruneCounts:
    """Rows removed (or, in a dry run, that would be), per table."""

    jobs: int = 0
    events: int = 0
    decisions: int = 0
    webhook_deliveries: int = 0
    webhook_attempts: int = 0
    result_files: int = 0
    batches: int = 0
    # False when `max_seconds` ran out with prunable jobs left.
    finished: bool = True

    def __add__(self, other: PruneCounts) -> PruneCounts:
        return PruneCounts(
            jobs=self.jobs + other.jobs,
            events=self.events + other.events,
            decisions=self.decisions + other.decisions,
            webhook_deliveries=self.webhook_deliveries + other.webhook_deliveries,
            webhook_attempts=self.webhook_attempts + other.webhook_attempts,
            result_files=self.result_files + other.result_files,
            batches=self.batches + other.batches,
            finished=other.finished,
        )


@transaction.atomic(durable=True)
def jobs_prune_batch(
    *, finished_before: datetime, batch_size: int = PRUNE_BATCH_SIZE
) -> PruneCounts:
    """Delete up to `batch_size` finished jobs that ended before `finished_before`,
    oldest first, with their events, dispatch decisions, webhook deliveries and
    attempts: one statement, one short transaction.

    Queued and running jobs are never touched. Rows another transaction holds
    are skipped, not waited for. Learned durations (RunStats) and lane clocks
    are aggregates without a job reference and stay. Result files are deleted
    from storage after the commit.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            WITH doomed AS (
                {_PRUNABLE}
                 ORDER BY job.finished_at
                 LIMIT %(limit)s
                   FOR UPDATE OF job SKIP LOCKED
            ), attempts AS (
                DELETE FROM queueapp_webhookattempt AS attempt
                 USING queueapp_webhookdelivery AS delivery, doomed
                 WHERE attempt.delivery_id = delivery.id AND delivery.job_id = doomed.id
                RETURNING 1
            ), deliveries AS (
                DELETE FROM queueapp_webhookdelivery AS delivery USING doomed
                 WHERE delivery.job_id = doomed.id RETURNING 1
            ), events AS (
                DELETE FROM queueapp_jobevent AS event USING doomed
                 WHERE event.job_id = doomed.id RETURNING 1
            ), decisions AS (
                DELETE FROM queueapp_dispatchdecision AS decision USING doomed
                 WHERE decision.job_id = doomed.id RETURNING 1
            ), jobs AS (
                DELETE FROM queueapp_job AS job USING doomed
                 WHERE job.id = doomed.id RETURNING job.result_file
            )
            SELECT (SELECT count(*) FROM jobs), (SELECT count(*) FROM events),
                   (SELECT count(*) FROM decisions), (SELECT count(*) FROM deliveries),
                   (SELECT count(*) FROM attempts),
                   (SELECT array_agg(result_file) FROM jobs WHERE result_file <> '')
            """,
            {"before": finished_before, "limit": batch_size},
        )
        jobs, events, decisions, deliveries, attempts, files = cursor.fetchone()
    files = files or []
    if files:
        transaction.on_commit(lambda: _result_files_delete(files))
    return PruneCounts(jobs, events, decisions, deliveries, attempts, len(files), batches=1)


def _result_files_delete(names: list[str]) -> None:
    from django.core.files.storage import default_storage

    for name in names:
        default_storage.delete(name)


def jobs_prune(
    *,
    finished_before: datetime,
    batch_size: int = PRUNE_BATCH_SIZE,
    dry_run: bool = False,
    max_seconds: float | None = None,
) -> PruneCounts:
    """Remove finished jobs that ended before `finished_before`, batch by batch.

    Each batch is its own transaction (`jobs_prune_batch`), so no lock is held
    for long and dispatches and submissions go on meanwhile. A dry run counts
    what would go and changes nothing. With `max_seconds`, stops after the
    batch that passes it (`finished` is then False: jobs are left).
    """
    if dry_run:
        return _prunable_counts(finished_before=finished_before)
    total = PruneCounts()
    deadline = None if max_seconds is None else time.monotonic() + max_seconds
    while True:
        batch = jobs_prune_batch(finished_before=finished_before, batch_size=batch_size)
        total += batch
        if batch.jobs < batch_size:
            return total
        if deadline is not None and time.monotonic() > deadline:
            return total + PruneCounts(finished=False)


def _prunable_counts(*, finished_before: datetime) -> PruneCounts:
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            WITH doomed AS ({_PRUNABLE})
            SELECT (SELECT count(*) FROM doomed),
                   (SELECT count(*) FROM queueapp_jobevent AS event
                      JOIN doomed ON doomed.id = event.job_id),
                   (SELECT count(*) FROM queueapp_dispatchdecision AS decision
                      JOIN doomed ON doomed.id = decision.job_id),
                   (SELECT count(*) FROM queueapp_webhookdelivery AS delivery
                      JOIN doomed ON doomed.id = delivery.job_id),
                   (SELECT count(*) FROM queueapp_webhookattempt AS attempt
                      JOIN queueapp_webhookdelivery AS delivery
                        ON delivery.id = attempt.delivery_id
                      JOIN doomed ON doomed.id = delivery.job_id),
                   (SELECT count(*) FROM doomed WHERE result_file <> '')
            """,
            {"before": finished_before},
        )
        jobs, events, decisions, deliveries, attempts, files = cursor.fetchone()
    return PruneCounts(jobs, events, decisions, deliveries, attempts, files)
