"""Reads. Every query the API and the dispatcher share lives here.

One clock: submission, start and end times are the database's `now()`, and
aging is computed against it (`db_now`), so processes on hosts whose clocks
differ age jobs alike.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, NamedTuple

from django.db import connection
from django.db.models import Count, Min, OuterRef, Q, QuerySet, Subquery
from django.db.models.expressions import RawSQL
from django.db.models.functions import Coalesce

from queueapp.errors import InvalidInput
from queueapp.liveness import dispatcher_alive_sql
from queueapp.models import (
    DispatchDecision,
    Gpu,
    Job,
    JobStatus,
    Member,
    ModelSetting,
    Policy,
    Tier,
    WebhookDelivery,
)
from queueapp.models.model_settings import SHOWN_FIELDS
from queueapp.policy import Candidate, PolicySettings
from queueapp.policy.facts import queued_candidate
from queueapp.prepared import from_row, model_columns, prepared_cursor, select_list

if TYPE_CHECKING:
    from django.contrib.auth.base_user import AbstractBaseUser
    from django.contrib.auth.models import AnonymousUser


def db_now() -> datetime:
    """The database clock: the one clock every process ages jobs by."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


@dataclass(frozen=True)
class MemberLine:
    """A member's state as a submission sees it under the lines lock."""

    name: str
    tier_id: int
    queued: int  # the member's queued jobs, every line
    # The line's (band, model) latest submission; None: no queued job in it yet.
    latest_submitted_at: datetime | None

    @property
    def is_empty(self) -> bool:
        return self.latest_submitted_at is None


def member_line_state(member_id: int, *, band: int, model: str) -> MemberLine:
    """The member's tier, queued count and one line, in one round trip."""
    with prepared_cursor() as cursor:
        cursor.execute(
            """
            SELECT member.name, member.tier_id,
                   (SELECT count(*) FROM queueapp_job
                     WHERE member_id = member.id AND status = 'queued'),
                   (SELECT max(submitted_at) FROM queueapp_job
                     WHERE member_id = member.id AND status = 'queued'
                       AND priority = %s AND model = %s)
              FROM queueapp_member AS member WHERE member.id = %s
            """,
            [band, model, member_id],
        )
        name, tier_id, queued, latest = cursor.fetchone()
    return MemberLine(name=name, tier_id=tier_id, queued=queued, latest_submitted_at=latest)


def policy_get(*, lock: bool = False) -> Policy:
    """The policy row; its defaults, unsaved, until an operator saves one
    (services.policy_update creates the row: a read writes nothing)."""
    queryset = Policy.objects.select_for_update() if lock else Policy.objects
    policy = queryset.filter(pk=1).first()
    return policy if policy is not None else Policy(pk=1)


def policy_settings(policy: Policy) -> PolicySettings:
    return PolicySettings(
        aging_divisor=policy.aging_divisor,
        swap_affinity_bonus=policy.swap_affinity_bonus,
        band_spacing=policy.band_spacing,
        shortest_first_weight=policy.shortest_first_weight,
        shortest_first_scale=policy.shortest_first_scale,
    )


def tier_bonuses() -> dict[str, float]:
    return dict(Tier.objects.values_list("name", "bonus"))


DISPATCHER_ALIVE_SQL = dispatcher_alive_sql("queueapp_gpu.id")


def gpus_list() -> list[Gpu]:
    """Every registered GPU, by name, each with `dispatcher_alive`: whether a
    live dispatcher holds it (queueapp/liveness.py). A GPU none holds claims
    nothing and follows no llama-swap: what its row last said is stale."""
    gpus: list[Gpu] = []
    for gpu in Gpu.objects.annotate(held=RawSQL(DISPATCHER_ALIVE_SQL, ())).order_by("name"):
        gpu.dispatcher_alive = gpu.held
        gpus.append(gpu)
    return gpus


def busy_seconds_sql(gpu: str, window: str) -> str:
    """SQL for the seconds of the last `window` (an interval expression) the
    GPU whose id is `gpu` ran at least one job (its running jobs counted up
    to now). Jobs sharing the GPU overlap: their union is counted, once."""
    return f"""
        (SELECT coalesce(sum(extract(epoch FROM upper(span) - lower(span))), 0)
           FROM unnest((
                SELECT range_agg(tstzrange(least(ran.since, ran.until), ran.until))
                  FROM (SELECT greatest(job.started_at, now() - {window}) AS since,
                               least(coalesce(job.finished_at, now()), now()) AS until
                          FROM queueapp_job AS job
                         WHERE job.gpu_id = {gpu} AND job.started_at IS NOT NULL
                           AND coalesce(job.finished_at, now()) > now() - {window}) AS ran
                )) AS span)
    """


def gpu_busy_seconds(gpu: Gpu, *, window_seconds: float) -> float:
    """Seconds of the last `window_seconds` the GPU ran a job (its running
    jobs counted up to now; jobs sharing it counted once)."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {busy_seconds_sql('%(gpu)s', 'make_interval(secs => %(window)s)')}",
            {"gpu": gpu.pk, "window": window_seconds},
        )
        return float(cursor.fetchone()[0])


def sole_gpu_resident_model() -> str | None:
    """The model loaded on the GPU, when there is one GPU; else None."""
    gpus = gpus_list()
    return gpus[0].resident_model or None if len(gpus) == 1 else None


def job_candidate(job: Job, *, lane_clock: datetime | None = None) -> Candidate:
    """The policy's view of a queued job (member and tier must be loaded):
    policy/facts.py `queued_candidate`, a job behind its line's head aging
    from its lane's last dispatch (`lane_clock`), see queueapp/lanes.py."""
    return queued_candidate(
        job_id=job.pk,
        band=job.priority,
        tier_bonus=job.member.tier.bonus,
        model=job.model,
        submitted_at=job.submitted_at.timestamp(),
        member_id=job.member_id,
        is_lane_head=job.is_lane_head,
        eligible_at=job.eligible_at.timestamp(),
        lane_clock=lane_clock.timestamp() if lane_clock else None,
        pinned_gpu=job.pinned_gpu,
        wait_deadline=job.wait_deadline.timestamp() if job.wait_deadline else None,
        shortness=job.shortness,
        expected_seconds=job.expected_p50,
    )


def queued_jobs() -> QuerySet[Job]:
    return Job.objects.filter(status=JobStatus.QUEUED).select_related("member__tier")


def queued_lane_heads() -> QuerySet[Job]:
    """The jobs that can be dispatched next: the first of each queue line."""
    return queued_jobs().filter(is_lane_head=True)


def job_get_for_member(*, job_id: int, member: Member) -> Job:
    """A member's own job; another member's job does not exist for them."""
    from queueapp.errors import NotFound

    job = Job.objects.select_related("member__tier", "gpu").filter(pk=job_id).first()
    if job is None or (job.member_id != member.pk and not member.is_staff):
        raise NotFound(f"job {job_id} not found")
    return job


def job_why_as_of(*, job: Job, raw: str | None) -> datetime | None:
    """The `as_of` query parameter of a job's `why`, read once for the API
    and the page: the instant a queued job's wait is told at, so that
    answers asked at one instant agree. Only a queued job's, between its
    submission and now; an InvalidInput naming `as_of` otherwise (a 400).
    None when not given: the answer is told at now."""
    if raw is None:
        return None
    try:
        moment = _iso_moment(raw)
    except ValueError:
        raise InvalidInput(
            "must be an ISO 8601 time with its offset (2026-01-01T12:00:00+00:00)",
            field="as_of",
        ) from None
    if job.status != JobStatus.QUEUED:
        raise InvalidInput(
            f"only for a job still queued; job {job.pk} is {job.status}: ask without it",
            field="as_of",
        )
    now = db_now()
    if not job.submitted_at <= moment <= now:
        raise InvalidInput(
            f"must lie between the job's submission ({job.submitted_at.isoformat()}) "
            f"and now ({now.isoformat()})",
            field="as_of",
        )
    return moment


def _iso_moment(raw: str) -> datetime:
    """A timezone-aware ISO 8601 time. A query string turns an unescaped
    "+01:00" into " 01:00": that space is read back as the plus it was."""
    try:
        moment = datetime.fromisoformat(raw)
    except ValueError:
        head, _, offset = raw.rpartition(" ")
        if not head:
            raise
        moment = datetime.fromisoformat(f"{head}+{offset}")
    if moment.tzinfo is None:
        raise ValueError("no offset")
    return moment


# The most recent jobs `GET /api/jobs/` lists.
JOB_LIST_LIMIT = 100


@dataclass(frozen=True)
class JobsWithWebhooks:
    """Jobs and, for those with a callback, their webhook deliveries in id
    order, each with its `attempt_log`: what rendering a job shows."""

    jobs: list[Job]
    webhook_logs: dict[int, list[WebhookDelivery]]

    def webhook_log(self, job_id: int) -> list[WebhookDelivery]:
        return self.webhook_logs.get(job_id, [])


def job_list_for_member(*, member: Member, status: str | None = None) -> JobsWithWebhooks:
    """A member's most recent jobs, newest first, with their webhook log: a
    fixed number of queries however many jobs and deliveries there are."""
    jobs = Job.objects.filter(member=member).select_related("member__tier", "gpu")
    if status is not None:
        jobs = jobs.filter(status=status)
    return jobs_with_webhooks(list(jobs[:JOB_LIST_LIMIT]))


def jobs_with_webhooks(jobs: list[Job]) -> JobsWithWebhooks:
    """`jobs` with their webhook deliveries and attempts (two queries at most)."""
    with_callback = [job.pk for job in jobs if job.callback_url]
    logs: dict[int, list[WebhookDelivery]] = {}
    if with_callback:
        deliveries = (
            WebhookDelivery.objects.filter(job_id__in=with_callback)
            .order_by("id")
            .prefetch_related("attempt_log")
        )
        for delivery in deliveries:
            logs.setdefault(delivery.job_id, []).append(delivery)
    return JobsWithWebhooks(jobs=jobs, webhook_logs=logs)


def jobs_reread(*, ids: Iterable[int]) -> dict[int, Job]:
    """Jobs read again by id (they may have moved on since), in one query."""
    return Job.objects.select_related("member__tier", "gpu").in_bulk(list(ids))


def webhook_delivery_latest(*, job: Job) -> WebhookDelivery | None:
    return job.webhooks.order_by("-id").first()


def job_counts_by_status(*statuses: str) -> dict[str, int]:
    """How many jobs are in each of `statuses`: a count each, which the
    partial indexes of queued and running jobs answer without a table scan."""
    return {status: Job.objects.filter(status=status).count() for status in statuses}


class RunningJob(NamedTuple):
    """A job running on a GPU, as the GPU's entry counts it."""

    id: int
    model: str


def running_jobs_by_gpu() -> dict[int, list[RunningJob]]:
    """Each GPU's running jobs, by slot: several when jobs of a model share
    it (its `parallel`) or jobs of co-resident models run side by side."""
    by_gpu: dict[int, list[RunningJob]] = {}
    for gpu_id, job_id, model in (
        Job.objects.filter(status=JobStatus.RUNNING, gpu__isnull=False)
        .order_by("gpu_slot", "id")
        .values_list("gpu_id", "id", "model")
    ):
        by_gpu.setdefault(gpu_id, []).append(RunningJob(job_id, model))
    return by_gpu


def model_parallels() -> dict[str, int]:
    """Each model's `parallel`; a model not listed runs one job at a time."""
    return dict(ModelSetting.objects.values_list("name", "parallel"))


def operator_parallels() -> dict[str, int]:
    """Each `parallel` the operator set, by model."""
    return {
        name: parallel
        for name, parallel in ModelSetting.objects.values_list("name", "operator_parallel")
        if parallel is not None
    }


def models_list() -> list[dict[str, Any]]:
    """Every model some GPU runs, reports slots for, or the operator has
    set, with its `parallel` and where that comes from, the operator's own
    value, its `on_caller_gone` (None: by path), its `typical_seconds` and
    the GPUs that run it (by name)."""
    settings = {row["name"]: row for row in ModelSetting.objects.values("name", *SHOWN_FIELDS)}
    gpus_of: dict[str, list[str]] = {name: [] for name in settings}
    for gpu in gpus_list():
        config = gpu.routing_config
        for model in gpu.runs_models() or []:
            if config is not None and model in config.aliases and model not in config.models:
                continue  # a second name of a model listed under its id
            gpus_of.setdefault(model, []).append(gpu.name)
    unset = {"parallel": 1, "parallel_source": "default", "operator_parallel": None}
    return [
        {
            "name": name,
            "parallel": row["parallel"],
            "parallel_source": row["parallel_source"],
            "operator_parallel": row["operator_parallel"],
            "on_caller_gone": row.get("on_caller_gone") or None,
            "typical_seconds": row.get("typical_seconds"),
            "gpus": gpus,
        }
        for name, gpus in sorted(gpus_of.items())
        for row in [settings.get(name, unset)]
    ]


def running_jobs() -> list[Job]:
    """Every running job, with member, tier and GPU, by GPU name, each with
    `in_flight`: the jobs on its GPU as it started, itself included (its
    last decision's), in the same query."""
    started_with = DispatchDecision.objects.filter(job=OuterRef("pk")).order_by("-id")
    return list(
        Job.objects.filter(status=JobStatus.RUNNING)
        .select_related("member__tier", "gpu")
        .annotate(in_flight=Coalesce(Subquery(started_with.values("in_flight")[:1]), 1))
        .order_by("gpu__name", "id")
    )


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


STATS_WINDOWS: dict[str, timedelta | None] = {
    "hour": timedelta(hours=1),
    "day": timedelta(days=1),
    "all": None,
}


def band_stats(*, window: str) -> list[dict]:
    """Per band: depth and longest wait now; dispatches in the window, how
    often each term changed which job went first, and the jobs that expired
    (their wait bound passed while queued)."""
    from queueapp.models import DispatchDecision
    from queueapp.policy import TERMS

    decisions = DispatchDecision.objects.all()
    expired_jobs = Job.objects.filter(status=JobStatus.EXPIRED)
    span = STATS_WINDOWS[window]
    if span is not None:
        since = db_now() - span
        decisions = decisions.filter(at__gte=since)
        expired_jobs = expired_jobs.filter(finished_at__gte=since)
    # Jobs whose wait bound passed while queued (in the window).
    expired = dict(
        expired_jobs.values_list("priority").annotate(n=Count("id")).order_by("priority")
    )
    dispatched: dict[int, dict[str, Any]] = {
        row["band"]: dict(row)
        for row in decisions.values("band").annotate(
            dispatched=Count("id"),
            **{term: Count("id", filter=Q(**{f"changed_by_{term}": True})) for term in TERMS},
        )
    }
    queued = {row["band"]: row for row in queue_bands()}
    bands = []
    for band in sorted(set(dispatched) | set(queued) | set(expired), reverse=True):
        counts = dispatched.get(band, {})
        bands.append(
            {
                "band": band,
                "queued": queued.get(band, {}).get("queued", 0),
                "longest_wait_seconds": queued.get(band, {}).get("longest_wait_seconds", 0.0),
                "dispatched": counts.get("dispatched", 0),
                "expired": expired.get(band, 0),
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
    # On the path of every front-door call: one prepared statement, no ORM query.
    with prepared_cursor() as cursor:
        cursor.execute(
            f"""
            SELECT {select_list("member", Member)}, {select_list("tier", Tier)}
              FROM queueapp_member AS member
              JOIN queueapp_tier AS tier ON tier.id = member.tier_id
             WHERE member.token_hash = %s
            """,
            [hash_token(token)],
        )
        row = cursor.fetchone()
    if row is None:
        return None
    split = len(model_columns(Member))
    member = from_row(Member, row[:split])
    member.tier = from_row(Tier, row[split:])
    return member


def viewer_from_session(
    *, member_id: int | None, user: AbstractBaseUser | AnonymousUser | None
) -> Member | None:
    """Who looks at a page or the live queue: the member logged in with a token,
    or an operator signed in to the admin (seen as staff); else None."""
    if member_id is not None:
        member = Member.objects.select_related("tier").filter(pk=member_id).first()
        if member is not None:
            return member
    if user is not None and user.is_authenticated and getattr(user, "is_staff", False):
        return Member(name=f"admin:{user.get_username()}", is_staff=True)
    return None
