"""A claimed job's life after the claim: its lease, its end, and recovery.

A claim gives the job a lease (`ClaimedJob.claim_token`, `lease_expires_at`).
Whoever runs the job, the dispatcher's heartbeat or a front-door caller's
connection, renews it every `lease_renew_interval`; a job whose lease runs
out belongs to a dispatcher that died, and `jobs_recover_expired` queues it
again at its old place (or fails it). Every write here matches the claim's
token, so a finish that arrives after the lease was lost changes nothing.

Each function is one short transaction, with the job's audit event
(decisions.py) written in it.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.core.files.base import ContentFile
from django.db import connection, transaction
from django.db.models.functions import Now

from queueapp.dispatch.claim import ClaimedJob
from queueapp.dispatch.decisions import job_end_log, job_event_record
from queueapp.eta import run_stats_record
from queueapp.gateways import LIVE_GATEWAYS_SQL
from queueapp.lanes import line_restore_head
from queueapp.locks import lock_gpu_claims, lock_member_lines
from queueapp.models import DispatchDecision, Job, JobEvent, JobStatus
from queueapp.selectors import db_now, policy_get
from queueapp.upstream.client import UpstreamAnswer
from queueapp.webhooks.delivery import webhook_enqueue

logger = logging.getLogger(__name__)

# The lease is renewed this many times over its length, so that one late
# renewal (a slow query, a database restart) does not lose it.
LEASE_RENEWALS_PER_LEASE = 3
# Never renew more often than this, however short the lease.
LEASE_RENEW_MIN_SECONDS = 0.2


def lease_renew_interval(lease_seconds: float) -> float:
    """Seconds between two renewals of a lease of `lease_seconds`."""
    return max(LEASE_RENEW_MIN_SECONDS, lease_seconds / LEASE_RENEWALS_PER_LEASE)


def job_lease_renew(*, claim: ClaimedJob) -> bool:
    """Extend the lease; False when the job is no longer this claim's."""
    return bool(
        Job.objects.filter(
            pk=claim.job_id, status=JobStatus.RUNNING, lease_owner=claim.claim_token
        ).update(lease_expires_at=Now() + timedelta(seconds=claim.lease_seconds))
    )


def _locked_claimed_job(claim: ClaimedJob, *, changes_lines: bool = False) -> Job | None:
    if changes_lines:
        # Before the job's row lock (queueapp/locks.py); a finish needs neither.
        member_id = Job.objects.filter(pk=claim.job_id).values_list("member_id", flat=True).first()
        if member_id is not None:
            lock_member_lines(member_id)
    job = (
        Job.objects.select_for_update()
        .filter(pk=claim.job_id, status=JobStatus.RUNNING, lease_owner=claim.claim_token)
        .first()
    )
    if job is None:
        logger.warning("job %s is no longer held by %s", claim.job_id, claim.claim_token)
    return job


def job_finish(
    *,
    claim: ClaimedJob,
    answer: UpstreamAnswer | None,
    error: str | None,
    inline_limit: int,
    caller_gone: bool = False,
) -> bool:
    """Store llama-swap's answer (or the transport error) and end the job.

    `caller_gone`: the front door's caller hung up mid-call; the failure is
    theirs, not llama-swap's (the event's `cause` tells the metrics apart)."""
    with transaction.atomic(durable=True):
        job = _locked_claimed_job(claim)
        if job is None:
            return False
        job.finished_at = db_now()
        job.lease_expires_at = None
        if answer is not None:
            _store_answer(job, answer, inline_limit=inline_limit)
        succeeded = (
            answer is not None and 200 <= answer.status_code < 300 and not answer.is_invalid_json
        )
        job.status = JobStatus.SUCCEEDED if succeeded else JobStatus.FAILED
        if not succeeded:
            job.error = error or _failure(answer)
        job.save()
        detail = {"status_code": job.result_status_code, "error": job.error or None}
        if not succeeded:
            detail["cause"] = "caller" if caller_gone else "upstream"
        job_event_record(job=job, kind=JobEvent.Kind(job.status), detail=detail)
        webhook_enqueue(job=job)
        job_end_log(job)
        if succeeded:
            swapped = claim.swap_needed
            if swapped is None:
                decision = DispatchDecision.objects.filter(job_id=job.pk).order_by("-id").first()
                swapped = bool(decision and decision.swap_needed)
            run_stats_record(
                model=job.model,
                path=job.path,
                seconds=(job.finished_at - (job.started_at or job.finished_at)).total_seconds(),
                swapped=swapped,
            )
        return True


def job_fail_gone_caller(*, job_id: int) -> bool:
    """End a running front-door job whose web process died: its caller can
    neither use the GPU nor end the job, so the GPU is freed now rather than
    when the lease runs out. False when it ended meanwhile or its process
    is alive after all."""
    with transaction.atomic(durable=True):
        with connection.cursor() as cursor:
            cursor.execute(
                f"""
                SELECT id FROM queueapp_job
                 WHERE id = %s AND status = 'running' AND gateway IS NOT NULL
                   AND gateway NOT IN ({LIVE_GATEWAYS_SQL})
                   FOR UPDATE
                """,
                [job_id],
            )
            if cursor.fetchone() is None:
                return False
        job = Job.objects.get(pk=job_id)
        lost_owner = job.lease_owner
        _fail_front_door(job, reason="the web process holding the caller stopped")
        job.save()
        job_event_record(
            job=job,
            kind=JobEvent.Kind.FAILED,
            detail={
                "reason": "caller's web process stopped",
                "lost_owner": lost_owner,
                "cause": "caller",
            },
        )
        webhook_enqueue(job=job)
        job_end_log(job)
        return True


def _fail_front_door(job: Job, *, reason: str) -> None:
    """A granted front-door job whose caller is gone: failed, never retried
    (nobody waits for an answer any more). The caller saves it."""
    job.status = JobStatus.FAILED
    job.finished_at = db_now()
    job.lease_expires_at = None
    job.lease_owner = ""
    job.error = f"{reason}; not retried"


def _failure(answer: UpstreamAnswer | None) -> str:
    if answer is None:
        return "no answer"
    if answer.is_invalid_json and 200 <= answer.status_code < 300:
        return (
            f"llama-swap answered {answer.status_code} with a body that is not valid JSON "
            f"({len(answer.content)} bytes, kept as the result file)"
        )
    return f"llama-swap answered {answer.status_code}: {answer.error_message()}"


def _store_answer(job: Job, answer: UpstreamAnswer, *, inline_limit: int) -> None:
    job.result_status_code = answer.status_code
    job.result_content_type = answer.content_type
    parsed = answer.json()
    if parsed is not None and len(answer.content) <= inline_limit:
        job.result_body = parsed
    elif answer.content_type.startswith("text/") and len(answer.content) <= inline_limit:
        job.result_body = answer.content.decode("utf-8", "replace")
    else:
        # Images, audio, video and anything large: file storage, not the table.
        job.result_file.save(f"job-{job.pk}", ContentFile(answer.content), save=False)


def job_return_to_queue(*, claim: ClaimedJob, reason: str) -> bool:
    """Undo a claim whose body llama-swap never took (unreachable, busy)."""
    with transaction.atomic(durable=True):
        job = _locked_claimed_job(claim, changes_lines=True)
        if job is None:
            return False
        job.status = JobStatus.QUEUED
        job.started_at = None
        job.lease_expires_at = None
        job.lease_owner = ""
        job.attempts -= 1
        job.score_at_dispatch = None
        line_restore_head(job)
        job.save()
        job_event_record(job=job, kind=JobEvent.Kind.RETURNED_TO_QUEUE, detail={"reason": reason})
        return True


def jobs_recover_expired() -> list[int]:
    """Re-queue (or fail, past max_attempts) running jobs whose dispatcher died.

    A re-queued job keeps its submission and rank key, so it goes back to its
    original place in the queue.
    """
    with transaction.atomic(durable=True):
        lock_gpu_claims()
        running_expired = Job.objects.filter(status=JobStatus.RUNNING, lease_expires_at__lt=Now())
        # Nearly always none: one query, and no row locks, then.
        members = sorted(set(running_expired.values_list("member_id", flat=True)))
        if not members:
            return []
        for member_id in members:
            lock_member_lines(member_id)  # before the jobs' row locks (queueapp/locks.py)
        expired = list(running_expired.select_for_update())
        if not expired:
            return []
        policy = policy_get()
        now = db_now()
        for job in expired:
            lost_owner = job.lease_owner
            job.lease_expires_at = None
            job.lease_owner = ""
            if job.front_door:
                # Its caller's connection held the GPU and went silent.
                _fail_front_door(job, reason="the caller's connection stopped renewing its lease")
                kind = JobEvent.Kind.FAILED
            elif job.attempts >= policy.max_attempts:
                job.status = JobStatus.FAILED
                job.finished_at = now
                job.error = (
                    f"the dispatcher stopped while running this job {job.attempts} times "
                    f"(max_attempts is {policy.max_attempts}); not retried"
                )
                kind = JobEvent.Kind.FAILED
            else:
                job.status = JobStatus.QUEUED
                job.started_at = None
                job.score_at_dispatch = None
                line_restore_head(job)
                kind = JobEvent.Kind.REQUEUED
            job.save()
            detail = {"reason": "lease expired", "lost_owner": lost_owner}
            if kind == JobEvent.Kind.FAILED:
                # A front-door job's lease is renewed by its caller's connection.
                detail["cause"] = "caller" if job.front_door else "lease"
            job_event_record(job=job, kind=kind, detail=detail)
            webhook_enqueue(job=job)
            logger.warning("job %s: lease of %s expired; %s", job.pk, lost_owner, kind)
        return [job.pk for job in expired]
