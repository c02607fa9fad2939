"""Writes. Each state change is one transaction together with its audit row.

Job state changes are durable transactions (never nested in a caller's).
Settings changes that the admin's forms make are plain `atomic`, because
Django's change view already wraps the save in a transaction.
"""

from __future__ import annotations

import secrets
from typing import Any

from django.db import connection, transaction
from django.db.models import F, Value
from django.db.models.functions import Greatest, Least

from queueapp.dispatch.claim import lock_gpu_claims
from queueapp.errors import Conflict, InvalidInput, NotFound, QueueClosed, QueueLimitReached
from queueapp.gateways import gateways_gone_with_queued_jobs
from queueapp.job_body import body_problem
from queueapp.lanes import line_is_empty, line_promote_next, lock_member_lines
from queueapp.live.events import queue_changed
from queueapp.models import (
    Job,
    JobEvent,
    JobStatus,
    Member,
    Policy,
    Tier,
    hash_token,
    new_webhook_secret,
)
from queueapp.policy import (
    AGING_EPOCH_SECONDS,
    check_invariant,
    clamp_priority,
    parse_priority_header,
    rank_key,
)
from queueapp.selectors import db_now, policy_get, policy_settings, tier_bonuses
from queueapp.webhooks.delivery import webhook_enqueue


def _wake_dispatcher(*, notified: bool = False) -> None:
    from queueapp.dispatch import wakeup

    wakeup.work_available(notified=notified)


@transaction.atomic(durable=True)
def job_submit(
    *,
    member: Member,
    path: str,
    body: dict[str, Any],
    model: str,
    priority_header: str | None,
    callback_url: str = "",
    chain: dict[str, Any] | None = None,
    front_door: bool = False,
    gateway: int | None = None,
) -> Job:
    """Queue a job. The priority is parsed and clamped to the member's tier.

    `gateway`: the web process whose caller waits for a front-door job
    (queueapp/frontdoor/gateway.py); the job is granted only while it lives.

    Raises QueueLimitReached when the member already has the tier's maximum
    of queued jobs.
    """
    problem = body_problem(body)
    if problem:
        raise InvalidInput(problem, field="body")
    policy = policy_get()
    if not policy.queue_open:
        raise QueueClosed("the queue is closed for maintenance; try again later")
    # The tier FOR SHARE, before the lines lock (tier_save takes them in the
    # same order): a tier change in progress is waited for, then read; one
    # that starts later waits for this job's commit and so re-clamps it.
    # Concurrent submissions share the lock.
    tier = _tier_shared(Member.objects.values_list("tier_id", flat=True).get(pk=member.pk))
    # The member's lines lock also serialises its submissions, so the limit
    # holds under concurrent requests, and a member_save in progress is waited for.
    lock_member_lines(member.pk)
    member = Member.objects.get(pk=member.pk)
    if member.tier_id != tier.pk:  # moved to another tier meanwhile
        tier = Tier.objects.get(pk=member.tier_id)
    member.tier = tier
    queued = Job.objects.filter(member=member, status=JobStatus.QUEUED).count()
    if queued >= tier.max_queued_jobs:
        raise QueueLimitReached(
            f"{member.name} has {queued} jobs queued; tier {tier.name} allows "
            f"{tier.max_queued_jobs}. Submit more when one has started.",
            retry_after=_seconds_until_gpu_frees(),
        )
    requested = parse_priority_header(priority_header)
    applied = clamp_priority(requested, floor=tier.priority_floor, cap=tier.priority_cap)
    now = db_now()
    job = Job.objects.create(
        member=member,
        path=path,
        body=body,
        model=model,
        priority_requested=requested,
        priority=applied,
        submitted_at=now,
        eligible_at=now,
        rank_key=rank_key(
            band=applied,
            tier_bonus=tier.bonus,
            eligible_at=now.timestamp(),
            aging_divisor=policy.aging_divisor,
        ),
        # Last in its queue line, so its head only if the line was empty.
        is_lane_head=line_is_empty(member_id=member.pk, band=applied, model=model),
        callback_url=callback_url,
        front_door=front_door,
        gateway=gateway,
        chain_id=(chain or {}).get("id", ""),
        chain_index=(chain or {}).get("index"),
        chain_total=(chain or {}).get("total"),
    )
    JobEvent.objects.create(
        job=job,
        kind="submitted",
        detail={"priority_requested": requested, "priority": applied, "tier": tier.name},
    )
    queue_changed(kind="submitted", job_id=job.pk)
    _wake_dispatcher(notified=True)  # the INSERT's trigger told the dispatcher
    return job


def _tier_shared(tier_id: int) -> Tier:
    return Tier.objects.raw("SELECT * FROM queueapp_tier WHERE id = %s FOR SHARE", [tier_id])[0]


def _seconds_until_gpu_frees() -> int:
    from queueapp.eta import queue_forecast

    forecast = queue_forecast(horizon=1)
    return max(1, round((forecast.gpu_free_at - forecast.now).total_seconds()))


@transaction.atomic(durable=True)
def job_cancel(*, job: Job, by: str) -> Job:
    """Cancel a queued job; a started job runs to its end (no preemption)."""
    lock_member_lines(job.member_id)
    locked = Job.objects.select_for_update().get(pk=job.pk)
    if locked.status != JobStatus.QUEUED:
        raise Conflict(
            f"job {locked.pk} is {locked.status}; only a queued job can be cancelled "
            f"(a started job is never interrupted)"
        )
    _cancel_locked([locked], by=by)
    return locked


def front_door_orphans_cancel() -> int:
    """Cancel the queued front-door jobs whose caller's web process died.

    Nobody is left to relay their answers, so running them would only waste
    the GPU. One transaction per member, as a cancel by hand would be.
    """
    gone = gateways_gone_with_queued_jobs()
    if not gone:
        return 0
    orphans = Job.objects.filter(status=JobStatus.QUEUED, front_door=True, gateway__in=gone)
    cancelled = 0
    for member_id in sorted(set(orphans.values_list("member_id", flat=True))):
        with transaction.atomic(durable=True):
            lock_member_lines(member_id)
            jobs = list(orphans.filter(member_id=member_id).select_for_update())
            _cancel_locked(jobs, by="front door: the web process holding the caller stopped")
            cancelled += len(jobs)
    return cancelled


@transaction.atomic(durable=True)
def chain_cancel(*, member: Member, chain_id: str, by: str) -> int:
    """Cancel a chain's queued units; a running unit runs to its end."""
    lock_member_lines(member.pk)
    units = Job.objects.filter(member=member, chain_id=chain_id)
    if not units.exists():
        raise NotFound("chain not found")
    queued = list(units.select_for_update().filter(status=JobStatus.QUEUED))
    _cancel_locked(queued, by=by)
    return len(queued)


def _cancel_locked(jobs: list[Job], *, by: str) -> None:
    now = db_now()
    for job in jobs:
        job.status = JobStatus.CANCELLED
        job.finished_at = now
        job.is_lane_head = False
        job.save(update_fields=["status", "finished_at", "is_lane_head"])
        webhook_enqueue(job=job)
    JobEvent.objects.bulk_create(
        JobEvent(job=job, kind="cancelled", detail={"by": by}) for job in jobs
    )
    if jobs:
        queue_changed(kind="cancelled", job_id=jobs[0].pk if len(jobs) == 1 else None)
    if jobs:
        # A claim that met these rows locked skipped them and may have found
        # nothing else to run: wake the dispatcher for the new line heads.
        _wake_dispatcher()
    divisor = policy_get().aging_divisor
    for member_id, band, model in {(job.member_id, job.priority, job.model) for job in jobs}:
        line_promote_next(
            member_id=member_id,
            band=band,
            model=model,
            tier_bonus=Member.objects.select_related("tier").get(pk=member_id).tier.bonus,
            aging_divisor=divisor,
        )


@transaction.atomic(durable=True)
def job_requeue(*, job: Job, by: str) -> Job:
    """Put a finished (failed, cancelled, succeeded) job back in the queue.

    It queues as if submitted now, so a re-queue never jumps ahead of jobs
    that waited meanwhile.
    """
    lock_member_lines(job.member_id)
    locked = Job.objects.select_for_update().select_related("member__tier").get(pk=job.pk)
    if locked.status in (JobStatus.QUEUED, JobStatus.RUNNING):
        raise Conflict(f"job {locked.pk} is {locked.status} already")
    now = db_now()
    locked.status = JobStatus.QUEUED
    locked.submitted_at = locked.eligible_at = now
    locked.rank_key = rank_key(
        band=locked.priority,
        tier_bonus=locked.member.tier.bonus,
        eligible_at=now.timestamp(),
        aging_divisor=policy_get().aging_divisor,
    )
    locked.is_lane_head = line_is_empty(
        member_id=locked.member_id, band=locked.priority, model=locked.model
    )
    locked.started_at = locked.finished_at = None
    locked.attempts = 0
    locked.score_at_dispatch = None
    locked.result_status_code = None
    locked.result_content_type = ""
    locked.result_body = None
    locked.result_file = ""
    locked.error = ""
    locked.save()
    JobEvent.objects.create(job=locked, kind="requeued", detail={"by": by})
    queue_changed(kind="requeued", job_id=locked.pk)
    _wake_dispatcher()
    return locked


POLICY_FIELDS = Policy.EDITABLE_FIELDS


@transaction.atomic  # not durable: the admin's form view holds a transaction
def policy_update(*, changes: dict[str, Any]) -> Policy:
    """Change the policy; it applies from the next dispatch.

    Raises PolicyInvariantError (a ValueError) when the result would let a
    bounded term cross a band.
    """
    policy = policy_get(lock=True)
    old_divisor = policy.aging_divisor
    for field, value in changes.items():
        if field not in POLICY_FIELDS:
            raise ValueError(f"{field} is not a policy field")
        setattr(policy, field, value)
    check_invariant(policy_settings(policy), tier_bonuses())
    policy.save()
    if policy.aging_divisor != old_divisor:  # the only setting the keys depend on
        queued_rank_keys_refresh(aging_divisor=policy.aging_divisor)
    queue_changed(kind="policy")
    _wake_dispatcher()
    return policy


def tier_check(tier: Tier) -> None:
    """Refuse a tier change that breaks the band-spacing invariant."""
    bonuses = dict(Tier.objects.exclude(pk=tier.pk).values_list("name", "bonus"))
    bonuses[tier.name] = tier.bonus
    check_invariant(policy_settings(policy_get()), bonuses)


@transaction.atomic  # not durable: the admin's form view holds a transaction
def tier_save(*, tier: Tier, by: str = "") -> Tier:
    """Save a tier (new or changed); its queued jobs follow at once.

    A new cap or floor clamps the tier's queued jobs again from the priority
    they asked for (each move is a `reclamped` event), and the new bonus
    re-keys them, so the change applies from the next dispatch.
    """
    tier_check(tier)
    tier.save()
    divisor = policy_get().aging_divisor
    # The claim lock before the members' lines locks, the order the claim
    # and the lease recovery take them in.
    lock_gpu_claims()
    _queued_priorities_reclamp(tier=tier, aging_divisor=divisor, by=by)
    queued_rank_keys_refresh(aging_divisor=divisor, tier_id=tier.pk)
    queue_changed(kind="tier")
    _wake_dispatcher()
    return tier


def _queued_priorities_reclamp(
    *, tier: Tier, aging_divisor: float, by: str, member_id: int | None = None
) -> int:
    """Apply the tier's cap and floor to its queued jobs; returns how many moved.

    A moved job changes band, so it leaves one queue line and joins another:
    both lines get their head again (queueapp/lanes.py), under the member's
    lines lock.
    """
    clamped = Greatest(
        Value(tier.priority_floor), Least(Value(tier.priority_cap), F("priority_requested"))
    )
    stale = Job.objects.filter(member__tier=tier, status=JobStatus.QUEUED).exclude(priority=clamped)
    if member_id is not None:
        stale = stale.filter(member_id=member_id)
    members = sorted(set(stale.values_list("member_id", flat=True)))
    if not members:
        return 0
    for member_id in members:
        lock_member_lines(member_id)
    # Read again under the locks: a cancel or a dispatch may have moved some.
    moved = list(
        stale.filter(member_id__in=members)
        .select_for_update(of=("self",))
        .only("id", "member_id", "model", "priority", "priority_requested")
    )
    lines: set[tuple[int, int, str]] = set()
    events = []
    for job in moved:
        applied = clamp_priority(
            job.priority_requested, floor=tier.priority_floor, cap=tier.priority_cap
        )
        lines.add((job.member_id, job.priority, job.model))
        lines.add((job.member_id, applied, job.model))
        events.append(
            JobEvent(
                job=job,
                kind="reclamped",
                detail={
                    "priority_requested": job.priority_requested,
                    "priority_was": job.priority,
                    "priority": applied,
                    "tier": tier.name,
                    "by": by,
                },
            )
        )
    # Not heads for now: each line below picks its first job as its head.
    Job.objects.filter(pk__in=[job.pk for job in moved]).update(
        priority=clamped, is_lane_head=False
    )
    JobEvent.objects.bulk_create(events)
    for member_id, band, model in sorted(lines):
        line_promote_next(
            member_id=member_id,
            band=band,
            model=model,
            tier_bonus=tier.bonus,
            aging_divisor=aging_divisor,
        )
    return len(moved)


def queued_rank_keys_refresh(
    *, aging_divisor: float, tier_id: int | None = None, member_id: int | None = None
) -> int:
    """Recompute the stored rank key of lane heads after a policy, tier or member change.

    Same formula as queueapp.policy.rank_key; the ranking itself always
    recomputes from the inputs, so the stored key only has to order
    candidates well enough to be fetched first. Other queued jobs get their
    key when they become heads. Holds the claim lock, so a claim never waits
    on rows this rewrites (or the reverse).
    """
    lock_gpu_claims()
    sql = """
        UPDATE queueapp_job AS job
           SET rank_key = job.priority + tier.bonus
                          - (EXTRACT(EPOCH FROM job.eligible_at)::float8 - %s) / %s
          FROM queueapp_member AS member
          JOIN queueapp_tier AS tier ON tier.id = member.tier_id
         WHERE job.member_id = member.id AND job.status = 'queued' AND job.is_lane_head
    """
    params: list[Any] = [AGING_EPOCH_SECONDS, aging_divisor]
    if tier_id is not None:
        sql += " AND tier.id = %s"
        params.append(tier_id)
    if member_id is not None:
        sql += " AND member.id = %s"
        params.append(member_id)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.rowcount


def new_api_token() -> str:
    return "gps_" + secrets.token_urlsafe(32)


@transaction.atomic  # not durable: the admin's form view holds a transaction
def member_create(*, name: str, tier: Tier, is_staff: bool = False) -> tuple[Member, str]:
    """Create a member; returns it with its API token (shown once, stored hashed)."""
    token = new_api_token()
    member = Member.objects.create(
        name=name, tier=tier, is_staff=is_staff, token_hash=hash_token(token)
    )
    return member, token


@transaction.atomic  # not durable: the admin's form view holds a transaction
@transaction.atomic  # not durable: the admin's form view holds a transaction
def member_save(*, member: Member, by: str = "") -> Member:
    """Save a member's changes; under a new tier its queued jobs are clamped
    again to that tier's cap and floor and re-keyed with its bonus."""
    member.save()
    divisor = policy_get().aging_divisor
    lock_gpu_claims()  # before the member's lines lock, as tier_save takes them
    # A submission in progress finishes first (its job is then re-clamped); a
    # later one reads the new tier.
    lock_member_lines(member.pk)
    _queued_priorities_reclamp(
        tier=Tier.objects.get(pk=member.tier_id), aging_divisor=divisor, by=by, member_id=member.pk
    )
    queued_rank_keys_refresh(aging_divisor=divisor, member_id=member.pk)
    queue_changed(kind="member")
    _wake_dispatcher()
    return member


@transaction.atomic  # not durable: the admin's form view holds a transaction
def member_token_rotate(*, member: Member) -> str:
    token = new_api_token()
    member.token_hash = hash_token(token)
    member.save(update_fields=["token_hash"])
    return token


@transaction.atomic  # not durable: the admin's form view holds a transaction
def member_webhook_secret_rotate(*, member: Member) -> str:
    member.webhook_secret = new_webhook_secret()
    member.save(update_fields=["webhook_secret"])
    return member.webhook_secret
