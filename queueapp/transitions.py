"""Every change of a job's status, in one place.

A job moves queued → running → succeeded | failed | cancelled (or queued →
cancelled | expired), and back to queued when its claim is undone or its
dispatcher died. Each move here is one statement that names the states the
job may leave (its WHERE) and sets the same columns every time, so no path
forgets one (vLLM's one entry point per request transition):

- `start`: a queued line head → running (started_at, lease, attempts, GPU
  and slot, score; off the head);
- `end`: running under this claim → succeeded or failed (finished_at,
  result, error; lease cleared);
- `requeue`: running → queued, its line's head again (started_at, GPU,
  score, lease and the watchdog's report cleared);
- `fail`: running → failed without an answer (finished_at, error; lease
  cleared);
- `cancel`: queued → cancelled (finished_at; off the head);
- `expire`: queued → expired, its wait bound passed (finished_at, error;
  off the head); `start` never starts a job past its bound, so an overdue
  job can only expire, whoever finds it first;
- `resubmit`: succeeded, failed, cancelled or expired → queued as if
  submitted now (every run column cleared, the wait bound with them).

Each runs in the caller's transaction, which holds the locks (the member's
lines lock, queueapp/locks.py) and writes the audit event with the change.
A job found in no state it may leave raises `TransitionRefused`, except
where losing a race is normal: `start` names what stopped it (`NotStarted`),
and `end` with a lost lease returns None. `start` and `end` are plain SQL: they sit between two
GPU jobs, where every round trip counts (docs/benchmarks.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from django.db import connection
from psycopg.types.json import Jsonb

from queueapp.errors import Conflict
from queueapp.lanes import line_restore_head
from queueapp.locks import MEMBER_LINES_LOCK
from queueapp.models import Job, JobStatus, OnCallerGone
from queueapp.prepared import prepared_cursor

ENDED = (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.EXPIRED)
# What a job that stops running no longer has: set by every move out of running.
_LEAVING_RUNNING: dict[str, Any] = {"lease_expires_at": None, "lease_owner": ""}


class TransitionRefused(Conflict):
    """The job is in none of the states the move may leave."""


def _move(job: Job, *, leaving: tuple[str, ...], changes: dict[str, Any]) -> None:
    """One UPDATE guarded by the states it may leave; `job` then says what
    the row says."""
    assert connection.in_atomic_block, "a job's move runs inside its caller's transaction"
    if not Job.objects.filter(pk=job.pk, status__in=leaving).update(**changes):
        raise TransitionRefused(
            f"job {job.pk} cannot become {changes['status']}: it is no longer "
            f"{' or '.join(leaving)}"
        )
    for column, value in changes.items():
        setattr(job, column, value)


@dataclass(frozen=True)
class Started:
    body: Any  # the job's body, decoded
    parallel: int  # its model's slots on a GPU


class NotStarted(StrEnum):
    """Why `start` left a job queued; nothing was written."""

    HELD = "held"  # its row is held (another GPU's claim, a cancel), or it left the queue
    LINES_BUSY = "lines_busy"  # its member's lines are being changed
    AT_LIMIT = "at_limit"  # its member reached the running limit meanwhile
    OVERDUE = "overdue"  # its wait bound passed: it expires instead


def _start_sql(*, wait: bool) -> str:
    """`start`'s statement: the row locked (skipped when held, unless
    `wait`), what may stop it checked, and the move made, in one round trip."""
    return f"""
            WITH target AS (
                 SELECT id, member_id,
                        wait_deadline IS NULL OR wait_deadline > %(now)s AS in_time
                   FROM queueapp_job
                  WHERE id = %(job)s AND status = 'queued' AND is_lane_head
                    FOR UPDATE {"" if wait else "SKIP LOCKED"}),
            checked AS (
                 SELECT target.id, target.in_time,
                        target.in_time
                        AND pg_try_advisory_xact_lock(%(lines)s, target.member_id::integer)
                            AS lines_free,
                        -- decide.at_running_limit: a member may share a GPU it
                        -- holds, and may take another while it holds fewer
                        -- GPUs than its tier's limit (read only when checked).
                        NOT %(check_limit)s
                        OR EXISTS (SELECT 1 FROM queueapp_job AS running
                                    WHERE running.member_id = target.member_id
                                      AND running.status = 'running'
                                      AND running.gpu_id = %(gpu)s)
                        OR (SELECT count(DISTINCT running.gpu_id) FROM queueapp_job AS running
                             WHERE running.member_id = target.member_id
                               AND running.status = 'running')
                           < (SELECT tier.max_running_jobs FROM queueapp_member AS member
                                JOIN queueapp_tier AS tier ON tier.id = member.tier_id
                               WHERE member.id = target.member_id) AS under_limit
                   FROM target),
            started AS (
                 UPDATE queueapp_job AS job
                    SET status = 'running', is_lane_head = false, started_at = %(now)s,
                        lease_expires_at = %(expires)s, lease_owner = %(token)s,
                        attempts = %(attempt)s, score_at_dispatch = %(terms)s,
                        gpu_id = %(gpu)s, gpu_slot = %(slot)s, swap = %(swap)s
                   FROM checked
                  WHERE job.id = checked.id AND checked.lines_free AND checked.under_limit
              RETURNING job.body, coalesce((SELECT setting.parallel
                                              FROM queueapp_modelsetting AS setting
                                             WHERE setting.name = job.model), 1) AS parallel)
            SELECT checked.in_time, checked.lines_free, checked.under_limit,
                   started.body, started.parallel
              FROM (SELECT 1) AS one
              LEFT JOIN checked ON true
              LEFT JOIN started ON true
            """


def start(
    *,
    job_id: int,
    gpu_id: int,
    slot: int,
    now: datetime,
    lease_seconds: float,
    token: str,
    attempt: int,
    terms: dict[str, float],
    wait: bool,
    check_limit: bool,
    swap: dict[str, Any] | None = None,
) -> Started | NotStarted:
    """A queued line head running on GPU `gpu_id` in `slot` under a new
    lease, its row locked (waiting only when `wait`: another GPU's claim or
    a cancel may hold it) and its member's lines lock tried: the dispatch
    moves the member's line on (lanes.lane_dispatched_sql), so it must not
    overlap a change to the member's lines. `check_limit` (several GPUs):
    also under the member's running limit, read under that lock. Never a
    job whose wait bound passed by `now` (it expires instead). Otherwise
    what stopped it (`NotStarted`), in the same statement. `swap`: what
    llama-swap's routing is predicted to load and unload for it."""
    with prepared_cursor() as cursor:
        params: dict[str, Any] = {  # Jsonb: django-stubs knows only plain values
            "now": now,
            "expires": now + timedelta(seconds=lease_seconds),
            "token": token,
            "attempt": attempt,
            "terms": Jsonb(terms),
            "gpu": gpu_id,
            "slot": slot,
            "job": job_id,
            "lines": MEMBER_LINES_LOCK,  # true at once when already held
            "check_limit": check_limit,
            "swap": None if swap is None else Jsonb(swap),
        }
        cursor.execute(_start_sql(wait=wait), params)
        in_time, lines_free, under_limit, body, parallel = cursor.fetchone()
    if parallel is None:
        if in_time is None:
            return NotStarted.HELD
        if not in_time:
            return NotStarted.OVERDUE
        return NotStarted.LINES_BUSY if not lines_free else NotStarted.AT_LIMIT
    # Decoded as the ORM would (Django leaves jsonb undecoded in raw rows).
    body_field = Job._meta.get_field("body")
    decoded = body_field.from_db_value(body, None, connection)  # type: ignore[arg-type]  # JSONField ignores the expression
    return Started(body=decoded, parallel=parallel)


@dataclass(frozen=True)
class Ended:
    """What the end of a job needs to know of its row."""

    pk: int
    model: str
    path: str
    status: str
    error: str
    result_status_code: int | None
    started_at: datetime | None
    finished_at: datetime | None
    callback_url: str
    swap_needed: bool  # as its dispatch decision recorded
    in_flight: int  # jobs on its GPU as it started, itself included (its decision)
    size: float | None  # read from its body at submission: the learned line's input


_CONTENT_TYPE_CHARS = Job._meta.get_field("result_content_type").max_length


def end(
    *, job_id: int, token: str, outcome: Job, caller_gone: OnCallerGone | None = None
) -> Ended | None:
    """The running job of claim `token` ended as `outcome` says (its status,
    result and error), in one UPDATE that returns what the end's event,
    webhook and run statistics need; None when the job is no longer this
    claim's (its lease was lost).

    `caller_gone`: its front-door caller hung up. CLOSE: the request was
    closed, so the caller left now unless recorded earlier; DRAIN: the GPU
    was held from the recorded `caller_left_at` until now (`drained_seconds`)."""
    assert outcome.status in (JobStatus.SUCCEEDED, JobStatus.FAILED), outcome.status
    params: dict[str, Any] = {  # Jsonb: django-stubs knows only plain values
        "status": outcome.status,
        "code": outcome.result_status_code,
        # llama-swap relays its backend's header: one past the column must
        # not lose the job's end.
        "content_type": outcome.result_content_type[:_CONTENT_TYPE_CHARS],
        "body": None if outcome.result_body is None else Jsonb(outcome.result_body),
        "file": outcome.result_file.name or "",
        "error": outcome.error,
        "id": job_id,
        "token": token,
        "caller_gone": caller_gone.value if caller_gone is not None else None,
    }
    with prepared_cursor() as cursor:
        cursor.execute(
            """
            UPDATE queueapp_job AS job
               SET status = %(status)s, finished_at = now(), lease_expires_at = NULL,
                   lease_owner = '',
                   result_status_code = %(code)s, result_content_type = %(content_type)s,
                   result_body = %(body)s, result_file = %(file)s, error = %(error)s,
                   caller_left_at = CASE WHEN %(caller_gone)s::text IS NULL THEN job.caller_left_at
                                         ELSE coalesce(job.caller_left_at, now()) END,
                   drained_seconds = CASE WHEN %(caller_gone)s::text = 'drain'
                       THEN extract(epoch FROM now() - coalesce(job.caller_left_at, now())) END
              FROM (SELECT) AS one
              LEFT JOIN (SELECT swap_needed, in_flight FROM queueapp_dispatchdecision
                          WHERE job_id = %(id)s ORDER BY id DESC LIMIT 1) AS decision ON true
             WHERE job.id = %(id)s AND job.status = 'running' AND job.lease_owner = %(token)s
         RETURNING job.id AS pk, job.model, job.path, job.status, job.error,
                   job.result_status_code, job.started_at, job.finished_at, job.callback_url,
                   coalesce(decision.swap_needed, false) AS swap_needed,
                   coalesce(decision.in_flight, 1) AS in_flight, job.size
            """,
            params,
        )
        row = cursor.fetchone()
        names = [column.name for column in cursor.description or ()]
    return None if row is None else Ended(**dict(zip(names, row, strict=True)))


def requeue(job: Job, *, undo_attempt: bool) -> None:
    """A running job back in the queue at its old place (its submission and
    rank key kept), the first of its line again, to run on whichever GPU
    claims it next. `undo_attempt`: the body never reached llama-swap, so
    the start does not count."""
    line_restore_head(job)
    _move(
        job,
        leaving=(JobStatus.RUNNING,),
        changes={
            "status": JobStatus.QUEUED,
            "is_lane_head": True,
            "started_at": None,
            "gpu": None,
            "score_at_dispatch": None,
            "attempts": job.attempts - 1 if undo_attempt else job.attempts,
            "running_long_at": None,  # the next run is watched afresh
            **_LEAVING_RUNNING,
        },
    )


def fail(job: Job, *, error: str, at: datetime) -> None:
    """A running job ended as failed without an answer (its caller or its
    dispatcher is gone); `at` is the database's now."""
    _move(
        job,
        leaving=(JobStatus.RUNNING,),
        changes={"status": JobStatus.FAILED, "finished_at": at, "error": error, **_LEAVING_RUNNING},
    )


def cancel(job: Job, *, at: datetime) -> None:
    """A queued job cancelled before it ran; its line needs a new head
    (lanes.line_promote_next)."""
    _move(
        job,
        leaving=(JobStatus.QUEUED,),
        changes={"status": JobStatus.CANCELLED, "finished_at": at, "is_lane_head": False},
    )


def expire(job: Job, *, at: datetime, error: str) -> None:
    """A queued job whose wait bound passed, ended before it ran (`error`
    names what held the GPUs); its line needs a new head
    (lanes.line_promote_next)."""
    _move(
        job,
        leaving=(JobStatus.QUEUED,),
        changes={
            "status": JobStatus.EXPIRED,
            "finished_at": at,
            "error": error,
            "is_lane_head": False,
        },
    )


def resubmit(job: Job, *, at: datetime, rank_key: float, is_lane_head: bool) -> None:
    """An ended job queued again as if submitted `at`, every trace of its
    runs cleared."""
    _move(
        job,
        leaving=ENDED,
        changes={
            "status": JobStatus.QUEUED,
            "submitted_at": at,
            "eligible_at": at,
            "rank_key": rank_key,
            "is_lane_head": is_lane_head,
            "started_at": None,
            "finished_at": None,
            "gpu": None,
            "attempts": 0,
            "score_at_dispatch": None,
            "result_status_code": None,
            "result_content_type": "",
            "result_body": None,
            "result_file": "",
            "error": "",
            "caller_left_at": None,
            "drained_seconds": None,
            "wait_deadline": None,
            "running_long_at": None,
            **_LEAVING_RUNNING,
        },
    )
