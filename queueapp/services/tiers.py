"""Tiers: a change applies to the tier's queued jobs at once.

A tier's cap and floor bound the band its members' jobs run in, and its
bonus is part of their rank keys; saving a tier clamps and re-keys its
queued jobs in the same transaction, so the next claim sees the new tier.
"""

from __future__ import annotations

from django.db import transaction
from django.db.models import F, Value
from django.db.models.functions import Greatest, Least

from queueapp.dispatch import wakeup
from queueapp.lanes import line_promote_next
from queueapp.live.events import queue_changed
from queueapp.locks import lock_gpu_claims, lock_member_lines
from queueapp.models import Job, JobEvent, JobStatus, Tier
from queueapp.policy import check_invariant, clamp_priority
from queueapp.selectors import policy_get, policy_settings
from queueapp.services.policy import queued_rank_keys_refresh


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
    queued_priorities_reclamp(tier=tier, aging_divisor=divisor, by=by)
    queued_rank_keys_refresh(aging_divisor=divisor, tier_id=tier.pk)
    queue_changed(kind="tier")
    wakeup.work_available()
    return tier


def queued_priorities_reclamp(
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
                kind=JobEvent.Kind.RECLAMPED,
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
