"""Jobs: submit, cancel, re-queue, and the front door's orphans.

Each is one durable transaction that takes the member's lines lock before
any job row (queueapp/locks.py), because each changes a queue line's head
(queueapp/lanes.py).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from django.db import connection, transaction
from django.db.models.functions import Now
from psycopg.types.json import Jsonb

from queueapp import transitions
from queueapp.dispatch import wakeup
from queueapp.errors import (
    Conflict,
    InvalidInput,
    QueueClosed,
    QueueLimitReached,
    WaitBoundUnmet,
)
from queueapp.job_body import body_problem
from queueapp.lanes import line_is_empty, line_promote_next
from queueapp.live.events import queue_changed, queue_notice
from queueapp.liveness import gateways_gone_with_queued_jobs
from queueapp.locks import lock_member_lines
from queueapp.models import Gpu, Job, JobEvent, JobStatus, Member
from queueapp.policy import (
    band_for_path,
    rank_key,
    requested_priority,
)
from queueapp.policy.facts import gpus_alone
from queueapp.policy.priority import PRELOAD_PRIORITY
from queueapp.policy.request_size import RequestSize, request_size
from queueapp.policy.wait_bound import bound_for, expiry_tail, refusal_tail
from queueapp.prepared import prepared_cursor
from queueapp.selectors import db_now, policy_get
from queueapp.services.submission import (
    LinePlace,
    SubmissionOpening,
    job_row_insert,
    place_in_line,
    submission_open,
)
from queueapp.upstream.client import preload_path
from queueapp.webhooks.delivery import webhook_enqueue


def job_queue(
    *,
    member: Member,
    path: str,
    body: dict[str, Any],
    model: str,
    priority_header: str | None,
    priority_in_body: Any = None,
    callback_url: str = "",
    chain: dict[str, Any] | None = None,
    front_door: bool = False,
    gateway: int | None = None,
    max_wait: float | None = None,
    pinned_gpu: str = "",
    size: RequestSize | None = None,
) -> Job:
    """Queue a job, inside a transaction the caller holds (`job_submit` is
    this in a durable transaction of its own; the front door claims the GPU
    in the same one, `frontdoor.admission.job_submit_and_claim`). The priority is
    parsed and clamped to the member's tier.

    The band asked for is the header's (`priority_header`), else the
    body's (`priority_in_body`: a front-door body's `priority`, a REST
    submission's top-level one; None: not given), else the policy's band
    for `path` (queueapp/policy/priority.py).

    `gateway`: the web process whose caller waits for a front-door job
    (queueapp/frontdoor/gateway.py); the job is granted only while it lives.
    `pinned_gpu`: the one GPU that may run it (blank: any).
    `size`: its size, read from the whole body (a front-door call's: its job
    stores a summary); read here from `body` for any other job.

    Raises QueueLimitReached when the member already has the tier's maximum
    of queued jobs, and WaitBoundUnmet when the job has a wait bound
    (`max_wait` seconds, the X-Gpusched-Max-Wait header; else its band's
    default in the policy) and the forecast says it cannot start within it:
    the caller's transaction then rolls back, and no job exists.

    Two round trips before the INSERT: the clock, the queue's state, the
    member's tier (FOR SHARE) and the member's lines lock; then, under that
    lock, the member's queued count and line. They sit on the path of every
    front-door call (docs/benchmarks.md).
    """
    assert connection.in_atomic_block, "job_queue runs inside the caller's transaction"
    problem = body_problem(body)
    if problem:
        raise InvalidInput(problem, field="body")
    opening = _submission_opening(member_id=member.pk, model=model)
    if size is None and not front_door:
        size = request_size(path, body)
    requested = requested_priority(
        header=priority_header,
        body=priority_in_body,
        default=band_for_path(path, opening.priority_by_path),
    )
    place = place_in_line(opening, member_id=member.pk, requested=requested, model=model)
    member.tier = place.tier
    _check_queue_limit(place, member_id=member.pk)
    bound = bound_for(header=max_wait, band=place.applied, defaults=opening.max_wait_by_band)
    job = job_row_insert(
        member=member,
        place=place,
        opening=opening,
        path=path,
        body=body,
        model=model,
        callback_url=callback_url,
        chain=chain or {},
        front_door=front_door,
        gateway=gateway,
        wait_deadline=None if bound is None else opening.now + timedelta(seconds=bound),
        pinned_gpu=pinned_gpu,
        expected=opening.expected_run(model, path, size),
    )
    if bound is not None:
        _check_wait_bound(job, bound)
    _submitted_event_write(job, place=place, bound=bound)
    wakeup.work_available(notified=True)  # the INSERT's trigger told the dispatcher
    return job


def _submitted_event_write(job: Job, *, place: LinePlace, bound: float | None) -> None:
    """The job's `submitted` event: the band asked for and the one applied,
    the tier that clamped it, and its wait bound when it has one."""
    job_event_write(
        job_id=job.pk,
        kind=JobEvent.Kind.SUBMITTED,
        detail={
            "priority_requested": place.requested,
            "priority": place.applied,
            "tier": place.tier.name,
            **({} if bound is None else {"max_wait": bound}),
        },
    )


def _submission_opening(*, member_id: int, model: str) -> SubmissionOpening:
    """The submission's first round trip and its locks; refused while the
    queue is closed, or for a model no GPU serves."""
    # The tier FOR SHARE, then the lines lock (tier_save takes them in the
    # same order): a tier change in progress is waited for, then read; one
    # that starts later waits for this job's commit and so re-clamps it.
    # Concurrent submissions share the tier's lock. The member's lines lock
    # serialises its submissions, so the limit holds under concurrent
    # requests, and a member_save in progress is waited for.
    opening = submission_open(member_id, model=model)
    if not opening.queue_open:
        raise QueueClosed("the queue is closed for maintenance; try again later")
    if opening.models_served is not None and model not in opening.models_served:
        served = ", ".join(sorted(opening.models_served)) or "none"
        raise InvalidInput(f"no GPU serves {model!r}; the GPUs serve: {served}", field="model")
    return opening


def _check_queue_limit(place: LinePlace, *, member_id: int) -> None:
    """Refuse a job past the tier's queued jobs, with the seconds until the
    member's first queued job is forecast to start as the time to try again."""
    from queueapp.eta import seconds_until_first_start

    line, tier = place.line, place.tier
    if line.queued >= tier.max_queued_jobs:
        heads = Job.objects.filter(member_id=member_id, status=JobStatus.QUEUED, is_lane_head=True)
        raise QueueLimitReached(
            f"{line.name} has {line.queued} jobs queued; tier {tier.name} allows "
            f"{tier.max_queued_jobs}. Submit more when one has started.",
            retry_after=seconds_until_first_start(list(heads.values_list("pk", flat=True))),
        )


def _check_wait_bound(job: Job, bound: float) -> None:
    """Refuse the just-inserted `job` when the forecast (which plays it in
    its place) says it cannot start within `bound` seconds. Raised inside
    the submission's transaction, so the job's row is rolled back."""
    from queueapp.eta import job_start_estimate

    estimate = job_start_estimate(job)
    if estimate.misses(bound):
        raise WaitBoundUnmet(
            estimate.message(
                refusal_tail(start_in=estimate.start_in, bound=bound, at_least=estimate.at_least)
            ),
            retry_after=estimate.retry_after,
        )


job_submit = transaction.atomic(durable=True)(job_queue)
"""`job_queue` as a durable transaction of its own: how the API queues a job."""


def job_preload(
    *,
    member: Member,
    model: str,
    priority_header: str | None,
    priority_in_body: Any = None,
    gpu: str = "",
    callback_url: str = "",
) -> Job:
    """Queue a job that only loads `model` (llama-swap's own load,
    upstream.client.preload_path), at PRELOAD_PRIORITY unless the caller
    names a priority (the header, else the body's `priority`), on GPU `gpu`
    alone when named (decide's Skip.PINNED).
    A job like any other: scored, explained, forecast (as a swap,
    eta.Durations); one whose model is resident when it starts ends at once
    without a call (dispatch/forwarding.py)."""
    if gpu:
        _check_pin(gpu=gpu, model=model)
    return job_submit(
        member=member,
        path=preload_path(model),
        body={"model": model},
        model=model,
        priority_header=priority_header,
        priority_in_body=PRELOAD_PRIORITY if priority_in_body is None else priority_in_body,
        callback_url=callback_url,
        pinned_gpu=gpu,
    )


def _check_pin(*, gpu: str, model: str) -> None:
    """Refuse a pin no GPU could honour: an unknown or disabled GPU, or one
    that does not run the model (as far as its list is known)."""
    gpus = list(Gpu.objects.all())
    named = next((row for row in gpus if row.name == gpu), None)
    if named is None:
        names = ", ".join(row.name for row in gpus) or "none"
        raise InvalidInput(f"no GPU is named {gpu!r}; the GPUs: {names}", field="gpu")
    if not named.enabled:
        raise InvalidInput(f"{gpu} is disabled: it claims no job", field="gpu")
    runs = named.runs_models(alone=gpus_alone(sum(row.enabled for row in gpus)))
    if runs is not None and model not in runs:
        served = ", ".join(sorted(runs)) or "none"
        raise InvalidInput(f"{gpu} does not run {model!r}; it runs: {served}", field="gpu")


def job_event_write(*, job_id: int, kind: JobEvent.Kind, detail: dict[str, Any]) -> None:
    """A job's audit event, and the dashboard's notice of it (sent on commit);
    call inside the transaction of the change it records."""
    notice = queue_notice(kind=kind, job_id=job_id)
    # Jsonb: django-stubs knows only plain values.
    params: dict[str, Any] = {"job": job_id, "kind": kind.value, "detail": Jsonb(detail)}
    params.update(notice.params)
    with prepared_cursor() as cursor:
        cursor.execute(
            f"""
            WITH event AS (
                INSERT INTO queueapp_jobevent (job_id, at, kind, detail)
                VALUES (%(job)s, now(), %(kind)s, %(detail)s))
            SELECT {notice.sql}
            """,
            params,
        )


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
    queued_jobs_cancel([locked], by=by)
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
            queued_jobs_cancel(jobs, by="front door: the web process holding the caller stopped")
            cancelled += len(jobs)
    return cancelled


def queued_jobs_cancel(jobs: list[Job], *, by: str) -> None:
    """Cancel queued jobs whose rows the caller locked, under their member's
    lines lock, and give their lines a head again."""
    now = db_now()
    _queued_jobs_end(
        jobs,
        kind=JobEvent.Kind.CANCELLED,
        end=lambda job: transitions.cancel(job, at=now),
        detail=lambda job: {"by": by},
    )


def jobs_expire_overdue() -> int:
    """Expire the queued jobs whose wait bound has passed; how many.

    Each ends `expired` with an error that names what holds the GPUs it
    could use and how many jobs were forecast to start before it. Called
    every second or so by each dispatcher (and at once when a claim found
    an overdue head), by each web process's front-door housekeeping, and by
    a minute schedule on the `webhooks` cluster: whichever comes first. One
    transaction per member, as a cancel is.
    """
    overdue = Job.objects.filter(status=JobStatus.QUEUED, wait_deadline__lte=Now())
    found = list(overdue.defer("body"))  # the partial index job_queued_wait_deadline
    if not found:
        return 0
    from queueapp.eta import queue_forecast

    forecast = queue_forecast(include=found)
    why = {
        job.pk: forecast.start_estimate(job).message(expiry_tail(bound=_bound_of(job)))
        for job in found
    }
    expired = 0
    for member_id in sorted({job.member_id for job in found}):
        with transaction.atomic(durable=True):
            lock_member_lines(member_id)
            # Re-read under the lock: a claim or a cancel may have won meanwhile.
            jobs = list(overdue.filter(member_id=member_id).select_for_update())
            _queued_jobs_end(
                jobs,
                kind=JobEvent.Kind.EXPIRED,
                end=partial(_expire, at=db_now(), why=why),
                detail=lambda job: {"bound_seconds": _bound_of(job), "error": job.error},
            )
            expired += len(jobs)
    return expired


def _expire(job: Job, *, at: datetime, why: dict[int, str]) -> None:
    tail = expiry_tail(bound=_bound_of(job))
    # A job submitted after the forecast was read: no holder to name.
    transitions.expire(job, at=at, error=why.get(job.pk) or tail[0].upper() + tail[1:])


def _bound_of(job: Job) -> float:
    """The job's wait bound in seconds, as set at its submission."""
    assert job.wait_deadline is not None
    return round((job.wait_deadline - job.submitted_at).total_seconds(), 3)


def _queued_jobs_end(
    jobs: list[Job],
    *,
    kind: JobEvent.Kind,
    end: Callable[[Job], None],
    detail: Callable[[Job], dict[str, Any]],
) -> None:
    """End queued jobs whose rows the caller locked, under their member's
    lines lock (`end`: their transition), with their events and webhooks,
    and give their lines a head again."""
    for job in jobs:
        end(job)
        webhook_enqueue(job=job)
    JobEvent.objects.bulk_create(JobEvent(job=job, kind=kind, detail=detail(job)) for job in jobs)
    if jobs:
        queue_changed(kind=kind, job_id=jobs[0].pk if len(jobs) == 1 else None)
    if jobs:
        # A claim that met these rows locked skipped them and may have found
        # nothing else to run: wake the dispatcher for the new line heads.
        wakeup.work_available()
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
    transitions.resubmit(
        locked,
        at=now,
        rank_key=rank_key(
            band=locked.priority,
            tier_bonus=locked.member.tier.bonus,
            eligible_at=now.timestamp(),
            aging_divisor=policy_get().aging_divisor,
            shortness=locked.shortness,
        ),
        is_lane_head=line_is_empty(
            member_id=locked.member_id, band=locked.priority, model=locked.model
        ),
    )
    job_event_write(job_id=locked.pk, kind=JobEvent.Kind.REQUEUED, detail={"by": by})
    wakeup.work_available()
    return locked
