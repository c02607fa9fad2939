"""The dispatcher's writes: claim, lease renewal, finish, return, recovery.

Every function here is one short transaction; none is ever open while the
job's body travels to llama-swap. The claim holds a transaction-scoped
advisory lock so that two dispatchers (a re-delivered django-q2 task, a second
cluster started by mistake) serialise on "is the GPU free?", and a partial
unique index (one running job per GPU slot) makes a second running job
impossible even if that lock were bypassed.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.core.files.base import ContentFile
from django.db import connection, transaction
from django.db.models.functions import Now
from psycopg.types.json import Jsonb

from queueapp.eta import run_stats_record
from queueapp.gateways import LIVE_GATEWAYS_SQL
from queueapp.lanes import (
    MEMBER_LINES_LOCK,
    lane_dispatched,
    line_restore_head,
    lock_member_lines,
)
from queueapp.live.events import queue_changed
from queueapp.models import DispatchDecision, Job, JobEvent, JobStatus, Policy
from queueapp.policy import Candidate, counterfactual_winners, rank, rank_key
from queueapp.selectors import db_now, policy_get, policy_settings
from queueapp.upstream.client import UpstreamAnswer
from queueapp.webhooks.delivery import webhook_enqueue

logger = logging.getLogger(__name__)
# One JSON line per dispatch decision, for an operator to grep a day.
decision_log = logging.getLogger("gpusched.decisions")
# One human line per dispatch and per finish, for the terminal of `make run`.
activity_log = logging.getLogger("gpusched.activity")

# Key of the advisory lock that serialises claims ("gpusched" in ASCII).
GPU_CLAIM_LOCK = 0x67707573636865
# How many leading candidates the decision records: enough to show the
# runners-up, never the whole queue.
LEADING_CANDIDATES = 5
# Heads read from each index and ranked at each claim: the winner is always
# among the first few; the rest let the counterfactuals find who would win
# without a term.
CANDIDATE_POOL = 20
# Longest wait before looking again at a job another dispatcher runs.
BUSY_RECHECK_SECONDS = 5.0


@dataclass(frozen=True)
class ClaimedJob:
    job_id: int
    path: str
    body: Any
    model: str
    claim_token: str  # fences a late finish after the lease was lost
    lease_seconds: float
    swap_needed: bool | None  # None: not known here, read from the decision at finish
    # The caller's connection makes the call (OpenAI front door); the
    # dispatcher only holds the GPU for it until the job ends.
    granted: bool = False
    effective_score: float | None = None  # as ranked at the claim


@dataclass(frozen=True)
class GpuBusy:
    """Another dispatcher's job holds the GPU until its lease expires."""

    job_id: int
    seconds_left: float  # until its lease expires, bounded to a short re-check
    # A front-door job whose caller's web process died: nobody will use or
    # end it, so it is failed now rather than at lease expiry.
    caller_gone: bool = False


@dataclass(frozen=True)
class CallersGone:
    """The only queued heads are front-door jobs whose web process died: cancel
    them (services.front_door_orphans_cancel) and claim again."""

    job_ids: list[int]


def lock_gpu_claims() -> None:
    """Serialise with every claim until the current transaction ends."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [GPU_CLAIM_LOCK])


def try_lock_gpu_claims() -> bool:
    """The claim lock if nobody holds it now; False rather than wait."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [GPU_CLAIM_LOCK])
        return bool(cursor.fetchone()[0])


@dataclass(frozen=True)
class _GpuState:
    now: datetime
    running_job_id: int | None
    running_lease_expires_at: datetime | None
    running_caller_gone: bool  # a front-door job whose web process died
    previous_finished_at: datetime | None  # when the GPU last freed
    recorded_resident_model: str | None  # as the dispatcher last saw at llama-swap
    policy: Policy


_POLICY_COLUMNS = ("aging_divisor", "swap_affinity_bonus", "band_spacing", "lease_seconds")


def _gpu_state() -> _GpuState:
    """The clock, the running job and the policy, in one round trip."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT now(), running.id, running.lease_expires_at,
                   running.gateway IS NOT NULL
                       AND running.gateway NOT IN ({LIVE_GATEWAYS_SQL}),
                   previous.finished_at, upstream.resident_model,
                   policy.id IS NOT NULL, policy.dispatch_paused, policy.aging_divisor,
                   policy.swap_affinity_bonus, policy.band_spacing, policy.lease_seconds
              FROM (SELECT 1) AS one
              LEFT JOIN LATERAL (
                   SELECT id, lease_expires_at, gateway FROM queueapp_job
                    WHERE status = 'running' AND gpu_slot = 0 LIMIT 1) AS running ON true
              LEFT JOIN LATERAL (
                   SELECT job.finished_at FROM queueapp_dispatchdecision AS decision
                     JOIN queueapp_job AS job ON job.id = decision.job_id
                    ORDER BY decision.id DESC LIMIT 1) AS previous ON true
              LEFT JOIN queueapp_upstreamstate AS upstream ON upstream.id = 1
              LEFT JOIN queueapp_policy AS policy ON policy.id = 1
            """
        )
        (
            now,
            running_id,
            lease_expires_at,
            caller_gone,
            previous_finished_at,
            recorded_resident,
            has_policy,
            paused,
            *values,
        ) = cursor.fetchone()
    policy = Policy(pk=1)  # the defaults, until an operator saves a policy
    if has_policy:
        policy.dispatch_paused = paused
        for column, value in zip(_POLICY_COLUMNS, values, strict=True):
            setattr(policy, column, value)
    return _GpuState(
        now=now,
        running_job_id=running_id,
        running_lease_expires_at=lease_expires_at,
        running_caller_gone=bool(caller_gone),
        previous_finished_at=previous_finished_at,
        recorded_resident_model=recorded_resident or None,
        policy=policy,
    )


@dataclass(frozen=True)
class _Head:
    candidate: Candidate
    path: str
    attempts: int
    front_door: bool
    gateway: int | None
    caller_gone: bool  # a front-door job whose web process died: never granted


def _lock_candidates(resident_model: str | None) -> dict[int, _Head]:
    """The best line heads by key, and those of the resident model (the
    affinity bonus may lift one above the first), locked; skips rows another
    transaction holds (a cancel in progress). More than the winner needs, so
    the counterfactuals (who wins without a term) have a pool to choose from."""
    best_heads = """
        SELECT id FROM queueapp_job
         WHERE status = 'queued' AND is_lane_head {model}
         ORDER BY rank_key DESC, id LIMIT %(limit)s
    """
    wanted = f"({best_heads.format(model='')})"
    if resident_model:
        wanted += f" UNION ALL ({best_heads.format(model='AND model = %(model)s')})"
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            SELECT job.id, job.priority, tier.bonus, job.model, job.submitted_at,
                   job.eligible_at, job.member_id, job.path, job.attempts, job.front_door,
                   job.gateway, job.gateway IS NOT NULL AND NOT job.gateway = ANY(live.id)
              FROM queueapp_job AS job
              CROSS JOIN LATERAL (SELECT coalesce(array_agg(objid), '{{}}') AS id
                                    FROM ({LIVE_GATEWAYS_SQL}) AS alive(objid)) AS live
              JOIN queueapp_member AS member ON member.id = job.member_id
              JOIN queueapp_tier AS tier ON tier.id = member.tier_id
             WHERE job.id IN ({wanted}) AND job.status = 'queued' AND job.is_lane_head
               FOR UPDATE OF job SKIP LOCKED
            """,
            {"limit": CANDIDATE_POOL, "model": resident_model},
        )
        rows = cursor.fetchall()
    return {
        job_id: _Head(
            Candidate(
                job_id=job_id,
                band=band,
                tier_bonus=bonus,
                model=model,
                submitted_at=submitted_at.timestamp(),
                eligible_at=eligible_at.timestamp(),
                member_id=member_id,
            ),
            path=path,
            attempts=attempts,
            front_door=front_door,
            gateway=gateway,
            caller_gone=caller_gone,
        )
        for (
            job_id,
            band,
            bonus,
            model,
            submitted_at,
            eligible_at,
            member_id,
            path,
            attempts,
            front_door,
            gateway,
            caller_gone,
        ) in rows
    }


class _LinesBusy(Exception):
    """The chosen job's member is changing its lines (a submission, a cancel)."""


# The change holding the lines lock is one short transaction.
LINES_BUSY_RETRY_SECONDS = 0.005
LINES_BUSY_MAX_TRIES = 200


class _NotForThisGateway(Exception):
    """The best job is not one this gateway's callers wait for: roll back."""


def job_claim_next(
    *,
    resident_model: str | None,
    worker: str,
    for_gateway: int | None = None,
) -> ClaimedJob | GpuBusy | CallersGone | None:
    """Mark the best queued job running and record why; None when nothing to do.

    Plain SQL in eight round trips, BEGIN and COMMIT included: the claim sits
    between two GPU jobs, so every round trip and every ORM object counts
    (docs/benchmarks.md). The decision itself is `queueapp.policy.rank`.

    `for_gateway`: the same claim, made by a front-door web process for its
    own waiting callers (no hop through the dispatcher). It never waits for
    the claim lock, scores swap affinity by the resident model the dispatcher
    last recorded, and rolls back (None) unless the winner is one of that
    gateway's jobs: whoever the score picks, the dispatcher would grant the
    same job.
    """
    for _ in range(LINES_BUSY_MAX_TRIES - 1):
        try:
            return _claim_next(
                resident_model=resident_model, worker=worker, for_gateway=for_gateway
            )
        except _LinesBusy:
            if for_gateway is not None:
                return None  # the dispatcher waits for the lines instead
            time.sleep(LINES_BUSY_RETRY_SECONDS)
        except _NotForThisGateway:
            return None
    return _claim_next(resident_model=resident_model, worker=worker, wait_for_lines=True)


def _claim_next(
    *,
    resident_model: str | None,
    worker: str,
    for_gateway: int | None = None,
    wait_for_lines: bool = False,
) -> ClaimedJob | GpuBusy | CallersGone | None:
    with transaction.atomic(durable=True):
        if for_gateway is None:
            lock_gpu_claims()
        elif not try_lock_gpu_claims():
            return None  # the dispatcher is claiming: it grants the best job
        state = _gpu_state()
        if state.running_job_id is not None:
            left = (state.running_lease_expires_at - state.now).total_seconds()
            return GpuBusy(
                state.running_job_id,
                seconds_left=min(max(left, 0.0), BUSY_RECHECK_SECONDS),
                caller_gone=state.running_caller_gone,
            )
        policy, now = state.policy, state.now
        if policy.dispatch_paused:
            return None
        if for_gateway is not None:
            resident_model = state.recorded_resident_model
        settings = policy_settings(policy)
        all_heads = _lock_candidates(resident_model)
        # A caller whose web process died is never granted the GPU.
        heads = {job_id: head for job_id, head in all_heads.items() if not head.caller_gone}
        if not heads:
            return CallersGone(sorted(all_heads)) if all_heads else None
        ranked = rank(
            (head.candidate for head in heads.values()),
            now=now.timestamp(),
            resident_model=resident_model,
            settings=settings,
            top=LEADING_CANDIDATES,
        )
        if for_gateway is not None and heads[ranked[0].candidate.job_id].gateway != for_gateway:
            raise _NotForThisGateway
        chosen = ranked[0].candidate
        # The dispatch moves the chosen job's line on (lane_dispatched), so it
        # must not overlap a change to the member's lines (queueapp/lanes.py):
        # waited for on the last try, else tried in the UPDATE below.
        if wait_for_lines:
            lock_member_lines(chosen.member_id)
        terms = ranked[0].terms.as_dict()
        token = f"{worker}/{uuid.uuid4().hex[:12]}"
        attempt = heads[chosen.job_id].attempts + 1
        swap_needed = chosen.model != resident_model
        without = counterfactual_winners(
            [head.candidate for head in heads.values()],
            now=now.timestamp(),
            resident_model=resident_model,
            settings=settings,
        )
        changed = {term: winner != chosen.job_id for term, winner in without.items()}
        idle = (
            max(0.0, (now - state.previous_finished_at).total_seconds())
            if state.previous_finished_at
            else None
        )
        with connection.cursor() as cursor:
            cursor.execute(
                """
                UPDATE queueapp_job
                   SET status = 'running', is_lane_head = false, started_at = %s,
                       lease_expires_at = %s, lease_owner = %s, attempts = %s,
                       score_at_dispatch = %s
                 WHERE id = %s AND pg_try_advisory_xact_lock(%s, member_id::integer)
             RETURNING body
                """,
                [
                    now,
                    now + timedelta(seconds=policy.lease_seconds),
                    token,
                    attempt,
                    Jsonb(terms),
                    chosen.job_id,
                    MEMBER_LINES_LOCK,  # true at once when already held (last try)
                ],
            )
            updated = cursor.fetchone()
            if updated is None:  # a submission or cancel holds the member's lines
                raise _LinesBusy
            # Decoded as the ORM would (Django leaves jsonb undecoded in raw rows).
            body = Job._meta.get_field("body").from_db_value(updated[0], None, connection)
            # Fair share: the member's other jobs in this band age from now.
            lane_dispatched(
                member_id=chosen.member_id,
                band=chosen.band,
                model=chosen.model,
                at=now,
                key=rank_key(
                    band=chosen.band,
                    tier_bonus=chosen.tier_bonus,
                    eligible_at=now.timestamp(),
                    aging_divisor=settings.aging_divisor,
                ),
            )
            # The audit of this dispatch: the decision and the job's event.
            cursor.execute(
                """
                WITH decision AS (
                    INSERT INTO queueapp_dispatchdecision
                        (at, job_id, band, terms, candidates, resident_model, swap_needed,
                         policy, counterfactuals, changed_by_aging, changed_by_swap_affinity,
                         changed_by_tier_bonus, changed_by_fairness, idle_seconds)
                    VALUES (%(now)s, %(job)s, %(band)s, %(terms)s, %(candidates)s,
                            %(resident)s, %(swap)s, %(policy)s, %(counterfactuals)s,
                            %(aging)s, %(swap_affinity)s, %(tier_bonus)s, %(fairness)s,
                            %(idle)s))
                INSERT INTO queueapp_jobevent (job_id, at, kind, detail)
                VALUES (%(job)s, %(now)s, 'started', %(event)s)
                """,
                {
                    "now": now,
                    "job": chosen.job_id,
                    "terms": Jsonb(terms),
                    "candidates": Jsonb(
                        [
                            {"job_id": r.candidate.job_id, "model": r.candidate.model}
                            | r.terms.as_dict()
                            for r in ranked[:LEADING_CANDIDATES]
                        ]
                    ),
                    "resident": resident_model or "",
                    "swap": swap_needed,
                    "policy": Jsonb(
                        {
                            "aging_divisor": settings.aging_divisor,
                            "swap_affinity_bonus": settings.swap_affinity_bonus,
                            "band_spacing": settings.band_spacing,
                        }
                    ),
                    "event": Jsonb({"attempt": attempt, "worker": worker}),
                    "band": chosen.band,
                    "counterfactuals": Jsonb(
                        {
                            term: {"winner": without[term], "changed": changed[term]}
                            for term in without
                        }
                    ),
                    "idle": idle,
                    **changed,
                },
            )
        queue_changed(kind="started", job_id=chosen.job_id)
        transaction.on_commit(
            lambda: activity_log.info(
                "job %s started: %s %s, band %s, score %.1f%s",
                chosen.job_id,
                heads[chosen.job_id].path,
                chosen.model,
                chosen.band,
                terms["effective"],
                " (model swap)" if swap_needed else "",
            )
        )
        transaction.on_commit(
            lambda: decision_log.info(
                json.dumps(
                    {
                        "event": "dispatch",
                        "at": now.isoformat(),
                        "job": chosen.job_id,
                        "band": chosen.band,
                        "model": chosen.model,
                        "resident_model": resident_model,
                        "swap_needed": swap_needed,
                        "terms": terms,
                        "runners_up": [r.candidate.job_id for r in ranked[1:LEADING_CANDIDATES]],
                        "changed_by": sorted(term for term, flag in changed.items() if flag),
                        "idle_seconds": idle,
                    }
                )
            )
        )
        return ClaimedJob(
            job_id=chosen.job_id,
            path=heads[chosen.job_id].path,
            body=body,
            model=chosen.model,
            claim_token=token,
            lease_seconds=policy.lease_seconds,
            swap_needed=swap_needed,
            granted=heads[chosen.job_id].front_door,
            effective_score=terms["effective"],
        )


def job_lease_renew(*, claim: ClaimedJob) -> bool:
    """Extend the lease; False when the job is no longer this claim's."""
    return bool(
        Job.objects.filter(
            pk=claim.job_id, status=JobStatus.RUNNING, lease_owner=claim.claim_token
        ).update(lease_expires_at=Now() + timedelta(seconds=claim.lease_seconds))
    )


def _locked_claimed_job(claim: ClaimedJob, *, changes_lines: bool = False) -> Job | None:
    if changes_lines:
        # Before the job's row lock (queueapp/lanes.py); a finish needs neither.
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
        JobEvent.objects.create(job=job, kind=job.status, detail=detail)
        webhook_enqueue(job=job)
        queue_changed(kind=job.status, job_id=job.pk)
        _log_finish(job)
        if succeeded:
            swapped = claim.swap_needed
            if swapped is None:
                decision = DispatchDecision.objects.filter(job_id=job.pk).order_by("-id").first()
                swapped = bool(decision and decision.swap_needed)
            run_stats_record(
                model=job.model,
                path=job.path,
                seconds=(job.finished_at - job.started_at).total_seconds(),
                swapped=swapped,
            )
        return True


def _log_finish(job: Job) -> None:
    seconds = (job.finished_at - job.started_at).total_seconds() if job.started_at else 0.0
    outcome = job.status if job.status == JobStatus.SUCCEEDED else f"{job.status}: {job.error}"
    transaction.on_commit(
        lambda: activity_log.info("job %s %s after %.2f s", job.pk, outcome, seconds)
    )


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
        JobEvent.objects.create(
            job=job,
            kind=JobStatus.FAILED,
            detail={
                "reason": "caller's web process stopped",
                "lost_owner": lost_owner,
                "cause": "caller",
            },
        )
        webhook_enqueue(job=job)
        queue_changed(kind=JobStatus.FAILED, job_id=job.pk)
        _log_finish(job)
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
        JobEvent.objects.create(job=job, kind="returned_to_queue", detail={"reason": reason})
        queue_changed(kind="returned_to_queue", job_id=job.pk)
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
            lock_member_lines(member_id)  # before the jobs' row locks (queueapp/lanes.py)
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
                kind = "failed"
            elif job.attempts >= policy.max_attempts:
                job.status = JobStatus.FAILED
                job.finished_at = now
                job.error = (
                    f"the dispatcher stopped while running this job {job.attempts} times "
                    f"(max_attempts is {policy.max_attempts}); not retried"
                )
                kind = "failed"
            else:
                job.status = JobStatus.QUEUED
                job.started_at = None
                job.score_at_dispatch = None
                line_restore_head(job)
                kind = "requeued"
            job.save()
            detail = {"reason": "lease expired", "lost_owner": lost_owner}
            if kind == "failed":
                # A front-door job's lease is renewed by its caller's connection.
                detail["cause"] = "caller" if job.front_door else "lease"
            JobEvent.objects.create(job=job, kind=kind, detail=detail)
            webhook_enqueue(job=job)
            logger.warning("job %s: lease of %s expired; %s", job.pk, lost_owner, kind)
            queue_changed(kind=kind, job_id=job.pk)
        return [job.pk for job in expired]
