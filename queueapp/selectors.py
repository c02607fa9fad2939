"""Reads. Every query the API and the dispatcher share lives here."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import connection
from django.db.models import Count, Min, Q, QuerySet

from queueapp.models import Job, JobStatus, Member, Policy, Tier, UpstreamState
from queueapp.policy import Candidate, PolicySettings


def db_now() -> datetime:
    """The database clock: the one clock every process ages jobs by."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


def policy_get(*, lock: bool = False) -> Policy:
    queryset = Policy.objects.select_for_update() if lock else Policy.objects
    policy = queryset.filter(pk=1).first()
    return policy if policy is not None else Policy.objects.get_or_create(pk=1)[0]


def policy_settings(policy: Policy) -> PolicySettings:
    return PolicySettings(
        aging_divisor=policy.aging_divisor,
        swap_affinity_bonus=policy.swap_affinity_bonus,
        band_spacing=policy.band_spacing,
    )


def tier_bonuses() -> dict[str, float]:
    return dict(Tier.objects.values_list("name", "bonus"))


def upstream_state_get() -> UpstreamState:
    return UpstreamState.objects.get_or_create(pk=1)[0]


def job_candidate(job: Job, *, lane_clock: datetime | None = None) -> Candidate:
    """The policy's view of a queued job (member and tier must be loaded).

    A queue line's head carries its own `eligible_at`; a job behind it ages
    from the later of its submission and its lane's last dispatch
    (`lane_clock`), see queueapp/lanes.py.
    """
    eligible = job.eligible_at
    if not job.is_lane_head:
        eligible = max(job.submitted_at, lane_clock) if lane_clock else job.submitted_at
    return Candidate(
        job_id=job.pk,
        band=job.priority,
        tier_bonus=job.member.tier.bonus,
        model=job.model,
        submitted_at=job.submitted_at.timestamp(),
        eligible_at=eligible.timestamp(),
        member_id=job.member_id,
    )


def queued_jobs() -> QuerySet[Job]:
    return Job.objects.filter(status=JobStatus.QUEUED).select_related("member__tier")


def queued_lane_heads() -> QuerySet[Job]:
    """The jobs that can be dispatched next: the first of each queue line."""
    return queued_jobs().filter(is_lane_head=True)


def job_get_for_member(*, job_id: int, member: Member) -> Job:
    """A member's own job; another member's job does not exist for them."""
    from queueapp.errors import NotFound

    job = Job.objects.select_related("member__tier").filter(pk=job_id).first()
    if job is None or (job.member_id != member.pk and not member.is_staff):
        raise NotFound(f"job {job_id} not found")
    return job


def running_job() -> Job | None:
    return Job.objects.filter(status=JobStatus.RUNNING).select_related("member__tier").first()


def queue_bands() -> list[dict]:
    """Per band: queued jobs and the longest wait."""
    now = db_now()
    return [
        {
            "band": row["priority"],
            "queued": row["queued"],
            "longest_wait_seconds": round((now - row["oldest"]).total_seconds(), 3),
        }
        for row in Job.objects.filter(status=JobStatus.QUEUED)
        .values("priority")
        .annotate(queued=Count("id"), oldest=Min("submitted_at"))
        .order_by("-priority")
    ]


STATS_WINDOWS = {"hour": timedelta(hours=1), "day": timedelta(days=1), "all": None}


def band_stats(*, window: str) -> list[dict]:
    """Per band: depth and longest wait now; dispatches in the window and how
    often each term changed which job went first."""
    from queueapp.models import DispatchDecision
    from queueapp.policy import TERMS

    decisions = DispatchDecision.objects.all()
    if STATS_WINDOWS[window] is not None:
        decisions = decisions.filter(at__gte=db_now() - STATS_WINDOWS[window])
    dispatched = {
        row["band"]: row
        for row in decisions.values("band").annotate(
            dispatched=Count("id"),
            **{term: Count("id", filter=Q(**{f"changed_by_{term}": True})) for term in TERMS},
        )
    }
    queued = {row["band"]: row for row in queue_bands()}
    bands = []
    for band in sorted(set(dispatched) | set(queued), reverse=True):
        counts = dispatched.get(band, {})
        bands.append(
            {
                "band": band,
                "queued": queued.get(band, {}).get("queued", 0),
                "longest_wait_seconds": queued.get(band, {}).get("longest_wait_seconds", 0.0),
                "dispatched": counts.get("dispatched", 0),
                "order_changed_by": {term: counts.get(term, 0) for term in TERMS},
            }
        )
    return bands


def member_by_token(token: str) -> Member | None:
    """The member an API token belongs to (only its hash is stored)."""
    from queueapp.models import hash_token

    token = token.strip()
    if not token:
        return None
    return Member.objects.select_related("tier").filter(token_hash=hash_token(token)).first()


def viewer_from_session(*, member_id: int | None, user: object) -> Member | None:
    """Who looks at a page or the live queue: the member logged in with a token,
    or an operator signed in to the admin (seen as staff); else None."""
    if member_id is not None:
        member = Member.objects.select_related("tier").filter(pk=member_id).first()
        if member is not None:
            return member
    if user is not None and user.is_authenticated and user.is_staff:  # type: ignore[attr-defined]
        return Member(name=f"admin:{user.get_username()}", is_staff=True)  # type: ignore[attr-defined]
    return None
