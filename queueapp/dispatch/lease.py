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

from queueapp import transitions
from queueapp.dispatch.claim import claim_in_end_transaction, gateway_claim
from queueapp.dispatch.decisions import job_end_log
from queueapp.dispatch.outcomes import ClaimedJob, HeldClaim, claimed
from queueapp.liveness import gateway_gone_sql
from queueapp.locks import lock_gpu_claims, lock_member_lines
from queueapp.models import Job, JobEvent, JobStatus, OnCallerGone
from queueapp.prepared import commit_without_flush_wait
from queueapp.selectors import db_now, policy_get
from queueapp.services.jobs import job_event_write
from queueapp.services.run_stats import run_stats_record
from queueapp.upstream.client import UpstreamAnswer, is_preload
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


def job_lease_renew(*, claim: HeldClaim) -> bool:
    """Extend the lease; False when the job is no longer this claim's."""
    return bool(
        Job.objects.filter(
            pk=claim.job_id, status=JobStatus.RUNNING, lease_owner=claim.claim_token
        ).update(lease_expires_at=Now() + timedelta(seconds=claim.lease_seconds))
    )


def _locked_claimed_job(claim: HeldClaim) -> Job | None:
    """The claimed job, locked, with its member's lines locked first
    (queueapp/locks.py); None when it is no longer this claim's."""
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


@transaction.atomic(durable=True)
def job_end_and_grant(
    *,
    claim: HeldClaim,
    answer: UpstreamAnswer | None,
    error: str | None,
    inline_limit: int,
    gateway: int | None,
    worker: str,
    caller_gone: OnCallerGone | None = None,
) -> ClaimedJob | None:
    """A front-door job ended (`job_end`) and, in the same commit, the GPU
    claimed for the next of `gateway`'s waiting callers if the score picks
    one (`gateway_claim`). `gateway` None: none of its callers waits, so
    only the end; the dispatcher, woken by it, claims for everyone else.
    The claim is for the GPU the job ran on: the one its end frees."""
    commit_without_flush_wait()  # the caller has its answer already
    job_end(
        claim=claim,
        answer=answer,
        error=error,
        inline_limit=inline_limit,
        caller_gone=caller_gone,
    )
    if gateway is None:
        return None
    return claimed(gateway_claim(gateway=gateway, worker=worker, gpu=claim.gpu_id))


@transaction.atomic(durable=True)
def job_end_and_claim_next(
    *,
    claim: HeldClaim,
    answer: UpstreamAnswer | None,
    error: str | None,
    inline_limit: int,
    resident_model: str | None,
    worker: str,
) -> ClaimedJob | None:
    """The dispatcher's end of a job (`job_end`) and, in the same commit,
    its GPU's next job claimed (`claim.claim_in_end_transaction`), scored with
    `resident_model` (the model llama-swap just answered with). None: the
    end only (the lease was lost, nothing waits, or a lock was held); the
    dispatcher then claims as usual."""
    if not job_end(claim=claim, answer=answer, error=error, inline_limit=inline_limit):
        return None
    if claim.gpu_id is None:
        return None
    return claimed(
        claim_in_end_transaction(gpu=claim.gpu_id, resident_model=resident_model, worker=worker)
    )


def job_end(
    *,
    claim: HeldClaim,
    answer: UpstreamAnswer | None,
    error: str | None,
    inline_limit: int,
    caller_gone: OnCallerGone | None = None,
) -> bool:
    """Store llama-swap's answer (or the transport error) and end the job,
    in the caller's transaction (`job_end_durable` is this in a durable one of
    its own).

    `caller_gone`: the front door's caller hung up mid-call, and its request
    was closed or drained (`transitions.end`); the failure is theirs, not
    llama-swap's (the event's `cause` tells the metrics apart).

    Three statements, for it sits between two GPU jobs: the UPDATE matches
    the claim's token (a finish after the lease was lost changes nothing)
    and returns the row, with whether the claim swapped models, for the
    event, the webhook and the run statistics."""
    assert connection.in_atomic_block, "job_end runs inside the caller's transaction"
    succeeded = (
        answer is not None and 200 <= answer.status_code < 300 and not answer.is_invalid_json
    )
    ending = Job(pk=claim.job_id, status=JobStatus.SUCCEEDED if succeeded else JobStatus.FAILED)
    if answer is not None:
        _store_answer(ending, answer, inline_limit=inline_limit)
    if not succeeded:
        ending.error = error or _failure(answer)
    job = transitions.end(
        job_id=claim.job_id, token=claim.claim_token, outcome=ending, caller_gone=caller_gone
    )
    if job is None:
        if ending.result_file:
            ending.result_file.delete(save=False)  # the lease was lost: not this claim's to keep
        logger.warning("job %s is no longer held by %s", claim.job_id, claim.claim_token)
        return False
    detail = {"status_code": job.result_status_code, "error": job.error or None}
    if not succeeded:
        detail["cause"] = "caller" if caller_gone is not None else "upstream"
    if caller_gone is not None:
        detail["on_caller_gone"] = caller_gone.value
    job_event_write(job_id=job.pk, kind=JobEvent.Kind(job.status), detail=detail)
    if job.callback_url:
        webhook_enqueue(job=Job.objects.get(pk=job.pk))  # the payload renders the whole job
    job_end_log(job)
    swapped = claim.swap_needed if claim.swap_needed is not None else job.swap_needed
    # A preload that found its model resident measured nothing; one that
    # loaded it measured the swap (eta.Durations reads it so).
    if succeeded and (swapped or not is_preload(job.path)):
        assert job.finished_at is not None  # set by the UPDATE
        run_stats_record(
            model=job.model,
            path=job.path,
            seconds=(job.finished_at - (job.started_at or job.finished_at)).total_seconds(),
            swapped=swapped,
            concurrency=job.in_flight,
            size=job.size,
        )
    return True


job_end_durable = transaction.atomic(durable=True)(job_end)
"""`job_end` as a durable transaction of its own: how the dispatcher ends a job."""


@transaction.atomic(durable=True)
def job_caller_left(*, claim: HeldClaim) -> OnCallerGone | None:
    """A front-door caller hung up while its job ran: record when (with the
    event), and say what its model's `on_caller_gone` makes of the request
    to llama-swap (its path's default when the operator set nothing). None
    when the job is no longer this claim's: there is nothing to hold."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            UPDATE queueapp_job AS job SET caller_left_at = now()
             WHERE id = %s AND status = 'running' AND lease_owner = %s
         RETURNING job.path, (SELECT setting.on_caller_gone FROM queueapp_modelsetting AS setting
                               WHERE setting.name = job.model)
            """,
            [claim.job_id, claim.claim_token],
        )
        row = cursor.fetchone()
    if row is None:
        return None
    path, chosen = row
    mode = OnCallerGone(chosen) if chosen else OnCallerGone.by_path(path)
    job_event_write(
        job_id=claim.job_id,
        kind=JobEvent.Kind.CALLER_LEFT,
        detail={"on_caller_gone": mode.value, "set_for_model": bool(chosen)},
    )
    return mode


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
                 WHERE id = %s AND status = 'running' AND {gateway_gone_sql("gateway")}
                   FOR UPDATE
                """,
                [job_id],
            )
            if cursor.fetchone() is None:
                return False
        job = Job.objects.get(pk=job_id)
        lost_owner = job.lease_owner
        _fail_front_door(job, reason="the web process holding the caller stopped")
        job_event_write(
            job_id=job.pk,
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
    (nobody waits for an answer any more)."""
    transitions.fail(job, error=f"{reason}; not retried", at=db_now())


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


def job_return_to_queue(*, claim: HeldClaim, reason: str, cut_by_unload: bool = False) -> bool:
    """Undo a claim whose body llama-swap never took (unreachable, busy), or
    whose run llama-swap cut by unloading its model (`cut_by_unload`: the
    event says so, for `why` and for the rule that such a job goes back
    once)."""
    with transaction.atomic(durable=True):
        job = _locked_claimed_job(claim)
        if job is None:
            return False
        transitions.requeue(job, undo_attempt=True)  # it runs wherever it is claimed next
        detail: dict[str, object] = {"reason": reason}
        if cut_by_unload:
            detail["cut_by_unload"] = True
        job_event_write(job_id=job.pk, kind=JobEvent.Kind.RETURNED_TO_QUEUE, detail=detail)
        return True


def job_was_cut_by_unload(job_id: int) -> bool:
    """Whether the job went back to the queue once already because llama-swap
    unloaded its model under it."""
    return JobEvent.objects.filter(
        job_id=job_id, kind=JobEvent.Kind.RETURNED_TO_QUEUE, detail__cut_by_unload=True
    ).exists()


def jobs_recover_expired() -> list[int]:
    """Re-queue (or fail, past max_attempts) running jobs whose dispatcher died.

    A re-queued job keeps its submission and rank key, so it goes back to its
    original place in the queue.
    """
    return _recover_running(lease_expired=True, reason="lease expired")


def jobs_recover_after_restore() -> list[int]:
    """The same rules for every job a restored backup says is running: no
    process of this database holds its lease, though it may not have run out
    yet (a backup taken seconds ago), and the recovery sweep runs only
    between jobs, while a GPU with a job running waits for its end. So
    `manage.py restore` applies them at once: each goes back to its place
    to run again from the start (or fails, past max_attempts)."""
    return _recover_running(lease_expired=False, reason="restored from a backup")


def _recover_running(*, lease_expired: bool, reason: str) -> list[int]:
    """Re-queue or fail running jobs, each with its event, in one transaction;
    `lease_expired`: only those whose lease ran out."""
    with transaction.atomic(durable=True):
        lock_gpu_claims()
        held = Job.objects.filter(status=JobStatus.RUNNING)
        if lease_expired:
            held = held.filter(lease_expires_at__lt=Now())
        # Nearly always none: one query, and no row locks, then.
        members = sorted(set(held.values_list("member_id", flat=True)))
        if not members:
            return []
        for member_id in members:
            lock_member_lines(member_id)  # before the jobs' row locks (queueapp/locks.py)
        expired = list(held.select_for_update())
        if not expired:
            return []
        policy = policy_get()
        now = db_now()
        for job in expired:
            lost_owner = job.lease_owner
            if job.front_door:
                # Its caller's connection held the GPU and went silent.
                _fail_front_door(job, reason="the caller's connection stopped renewing its lease")
                kind = JobEvent.Kind.FAILED
            elif job.attempts >= policy.max_attempts:
                error = (
                    f"the dispatcher stopped while running this job {job.attempts} times "
                    f"(max_attempts is {policy.max_attempts}); not retried"
                )
                transitions.fail(job, error=error, at=now)
                kind = JobEvent.Kind.FAILED
            else:
                transitions.requeue(job, undo_attempt=False)
                kind = JobEvent.Kind.REQUEUED
            detail = {"reason": reason, "lost_owner": lost_owner}
            if kind == JobEvent.Kind.FAILED:
                # A front-door job's lease is renewed by its caller's connection.
                detail["cause"] = "caller" if job.front_door else "lease"
            job_event_write(job_id=job.pk, kind=kind, detail=detail)
            webhook_enqueue(job=job)
            logger.warning("job %s: %s (held by %s); %s", job.pk, reason, lost_owner, kind)
        return [job.pk for job in expired]
