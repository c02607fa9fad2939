"""Lanes: fair share inside a band without rewriting a member's whole backlog.

The lane clock (docs/policy.md): a job ages from the later of its submission
and the last dispatch of the same member's job in the same band. So a
member's jobs in one band that share a model differ in nothing but that age,
and go in submission order. Each such run of jobs, (member, band, model), is
a *queue line*; only its first job, the line head, can be dispatched before
the others, so only heads need a current `eligible_at` and `rank_key`, and
only heads are in the claim's indexes. A dispatch updates the job, the next
head of its line, and the heads of the member's other lines in that band (one
per model): a handful of rows, not the whole backlog.

The model is part of the line because swap affinity differs between models:
a member's later job for the loaded model may rightly go before the same
member's earlier job for another (docs/policy.md, S3). A job given back to
the queue becomes its line's head again, with its old key.

Invariant, kept by the functions below inside the caller's transaction: every
queue line with queued jobs has exactly one head, its first job by
(submitted_at, id), whose `eligible_at` is the later of its submission and
its lane's clock.

Every change to a member's lines holds that member's lines lock
(`lock_member_lines`, queueapp/locks.py): each reads the line and then writes
a head, so a submission and a dispatch of the same line at once would each
miss the other's row and leave the new job queued with no head, never to be
dispatched.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import F, QuerySet

from queueapp.models import Job, JobStatus, Lane
from queueapp.policy import rank_key


def line_jobs(*, member_id: int, band: int, model: str) -> QuerySet[Job]:
    return Job.objects.filter(
        member_id=member_id, priority=band, model=model, status=JobStatus.QUEUED
    )


def line_is_empty(*, member_id: int, band: int, model: str) -> bool:
    return not line_jobs(member_id=member_id, band=band, model=model).exists()


def lane_clock(*, member_id: int, band: int) -> datetime | None:
    return (
        Lane.objects.filter(member_id=member_id, band=band)
        .values_list("last_dispatched_at", flat=True)
        .first()
    )


def _key(band: int, tier_bonus: float, eligible: datetime, aging_divisor: float) -> float:
    """A head's rank key but its own shortness, which each row adds (job.shortness)."""
    return rank_key(
        band=band,
        tier_bonus=tier_bonus,
        eligible_at=eligible.timestamp(),
        aging_divisor=aging_divisor,
    )


def lane_dispatched_sql(
    *, member_id: int, band: int, model: str, at: datetime, tier_bonus: float, aging_divisor: float
) -> tuple[str, dict[str, Any]]:
    """A job of this lane was dispatched at `at` (it is no longer queued): the
    data-modifying CTEs that move the lane, with their parameters, for the
    statement that records the dispatch (dispatch/decisions.py).

    The lane's clock moves to `at`; the heads of the member's other lines in
    the band, and the next job of the dispatched job's line (now its head),
    age from `at`, all with the same key (same band, tier and start of
    aging). Run after the job was marked running, in a statement of its
    own, so that the line's next job is not the dispatched one.
    """
    sql = """
        lane_clock AS (
            INSERT INTO queueapp_lane (member_id, band, last_dispatched_at)
            VALUES (%(lane_member)s, %(lane_band)s, %(lane_at)s)
            ON CONFLICT (member_id, band) DO UPDATE SET last_dispatched_at = %(lane_at)s),
        lane_heads AS (
            UPDATE queueapp_job
               SET is_lane_head = true, eligible_at = %(lane_at)s,
                   rank_key = %(lane_key)s + shortness
             WHERE status = 'queued' AND member_id = %(lane_member)s AND priority = %(lane_band)s
               AND ((is_lane_head AND eligible_at < %(lane_at)s)
                    OR id = (SELECT id FROM queueapp_job
                              WHERE status = 'queued' AND member_id = %(lane_member)s
                                AND priority = %(lane_band)s AND model = %(lane_model)s
                              ORDER BY submitted_at, id LIMIT 1)))
    """
    params = {
        "lane_member": member_id,
        "lane_band": band,
        "lane_model": model,
        "lane_at": at,
        "lane_key": _key(band, tier_bonus, at, aging_divisor),
    }
    return sql, params


def line_promote_next(
    *, member_id: int, band: int, model: str, tier_bonus: float, aging_divisor: float
) -> None:
    """After a line's head left the queue: make its first queued job the head."""
    first = (
        line_jobs(member_id=member_id, band=band, model=model)
        .select_for_update()
        .order_by("submitted_at", "id")
        .only("id", "submitted_at", "is_lane_head")
        .first()
    )
    if first is None or first.is_lane_head:
        return
    clock = lane_clock(member_id=member_id, band=band)
    eligible = max(first.submitted_at, clock) if clock else first.submitted_at
    _demote_heads(line_jobs(member_id=member_id, band=band, model=model), keep=first.pk)
    Job.objects.filter(pk=first.pk).update(
        is_lane_head=True,
        eligible_at=eligible,
        rank_key=F("shortness") + _key(band, tier_bonus, eligible, aging_divisor),
    )


def line_restore_head(job: Job) -> None:
    """A job back in the queue at its old place (its claim was undone or its
    dispatcher died): the first of its line again, with its old key."""
    _demote_heads(
        line_jobs(member_id=job.member_id, band=job.priority, model=job.model), keep=job.pk
    )
    job.is_lane_head = True


def _demote_heads(line: QuerySet[Job], *, keep: int) -> None:
    line.filter(is_lane_head=True).exclude(pk=keep).update(is_lane_head=False)
