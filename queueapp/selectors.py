"""Reads. Every query the API and the dispatcher share lives here."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db import connection
from django.db.models import Count, Min, QuerySet

from queueapp.models import Job, JobStatus, Member, Policy, Tier, UpstreamState
from queueapp.policy import Candidate, PolicySettings, RankedCandidate, rank


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


def job_candidate(job: Job) -> Candidate:
    """The policy's view of a queued job (member and tier must be loaded)."""
    return Candidate(
        job_id=job.pk,
        band=job.priority,
        tier_bonus=job.member.tier.bonus,
        model=job.model,
        submitted_at=job.submitted_at.timestamp(),
        eligible_at=job.eligible_at.timestamp(),
        member_id=job.member_id,
    )


def queued_jobs() -> QuerySet[Job]:
    return Job.objects.filter(status=JobStatus.QUEUED).select_related("member__tier")


def job_get_for_member(*, job_id: int, member: Member) -> Job:
    """A member's own job; another member's job does not exist for them."""
    from queueapp.errors import NotFound

    job = Job.objects.select_related("member__tier").filter(pk=job_id).first()
    if job is None or (job.member_id != member.pk and not member.is_staff):
        raise NotFound(f"job {job_id} not found")
    return job


def running_job() -> Job | None:
    return Job.objects.filter(status=JobStatus.RUNNING).select_related("member__tier").first()


@dataclass(frozen=True)
class QueueSnapshot:
    now: datetime
    resident_model: str | None
    running: Job | None
    ranked: list[RankedCandidate]
    jobs_by_id: dict[int, Job]
    queued_total: int
    bands: list[dict]


def queue_snapshot(*, limit: int = 200) -> QueueSnapshot:
    """The running job and the queue in dispatch order, as of now.

    Ranks the `limit` best jobs by rank key plus those of the resident model,
    which is the same candidate set the claim considers, so the order shown is
    the order the dispatcher will follow if nothing changes.
    """
    policy = policy_get()
    settings = policy_settings(policy)
    resident = upstream_state_get().resident_model or None
    now = db_now()
    ordered = queued_jobs().order_by("-rank_key", "id")
    jobs = {job.pk: job for job in ordered[:limit]}
    if resident:
        jobs.update({job.pk: job for job in ordered.filter(model=resident)[:limit]})
    ranked = rank(
        (job_candidate(job) for job in jobs.values()),
        now=now.timestamp(),
        resident_model=resident,
        settings=settings,
    )[:limit]
    bands = [
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
    return QueueSnapshot(
        now=now,
        resident_model=resident,
        running=running_job(),
        ranked=ranked,
        jobs_by_id=jobs,
        queued_total=sum(band["queued"] for band in bands),
        bands=bands,
    )


def job_score_now(job: Job) -> dict:
    """Score terms of a queued job as of now (position and terms at this instant)."""
    policy = policy_get()
    resident = upstream_state_get().resident_model or None
    terms = rank(
        [job_candidate(job)],
        now=db_now().timestamp(),
        resident_model=resident,
        settings=policy_settings(policy),
    )[0].terms
    return terms.as_dict()
