"""Checks of the queue's invariants, for load tests, benchmarks and an operator's shell.

Each function reads and returns the violations it found as sentences (an
empty list: the invariant holds). Nothing here writes.

- Queue lines (queueapp/lanes.py): every line with queued jobs has exactly
  one head, its first job by (submitted_at, id); no job outside the queue is
  a head; each head's stored `rank_key` is the policy's key of its inputs.
- The queue's order as `GET /api/queue/` shows it: positions 1, 2, 3 …; each
  line's jobs in submission order; the first entry is the job the claim
  would choose (`queueapp.policy.rank` over the heads); with nothing
  running, the order is the one `play_forward` gives from every queued job.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import connection

from queueapp.durations import Durations
from queueapp.models import Job, JobStatus, Lane
from queueapp.policy import AGING_EPOCH_SECONDS, check_invariant, play_forward, rank
from queueapp.selectors import (
    db_now,
    job_candidate,
    policy_get,
    policy_settings,
    queued_jobs,
    queued_lane_heads,
    sole_gpu_resident_model,
    tier_bonuses,
)

# Relative tolerance when comparing a stored rank key with the recomputed one.
KEY_TOLERANCE = 1e-9


def queue_lines_violations() -> list[str]:
    """Queue lines with no head, several heads or the wrong head; stale keys."""
    problems: list[str] = []
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT member_id, priority, model, count(*),
                   count(*) FILTER (WHERE is_lane_head),
                   (array_agg(id ORDER BY submitted_at, id))[1],
                   array_agg(id ORDER BY id) FILTER (WHERE is_lane_head)
              FROM queueapp_job
             WHERE status = 'queued'
             GROUP BY member_id, priority, model
            """
        )
        for member_id, band, model, jobs, heads, first_id, head_ids in cursor.fetchall():
            line = f"line (member {member_id}, band {band}, model {model!r}, {jobs} queued)"
            if heads != 1:
                problems.append(f"{line} has {heads} heads: {head_ids or []}")
            elif head_ids[0] != first_id:
                problems.append(f"{line}: head is job {head_ids[0]}, its first job is {first_id}")
        cursor.execute(
            "SELECT id, status FROM queueapp_job WHERE is_lane_head AND status <> 'queued'"
        )
        problems.extend(
            f"job {job_id} is {status} but marked as a line head"
            for job_id, status in cursor.fetchall()
        )
        cursor.execute(
            """
            SELECT job.id, job.rank_key,
                   job.priority + tier.bonus + job.shortness
                   - (EXTRACT(EPOCH FROM job.eligible_at)::float8 - %s) / %s
              FROM queueapp_job AS job
              JOIN queueapp_member AS member ON member.id = job.member_id
              JOIN queueapp_tier AS tier ON tier.id = member.tier_id
             WHERE job.status = 'queued' AND job.is_lane_head
            """,
            [AGING_EPOCH_SECONDS, policy_get().aging_divisor],
        )
        for job_id, stored, expected in cursor.fetchall():
            if abs(stored - expected) > KEY_TOLERANCE * max(1.0, abs(expected)):
                problems.append(f"job {job_id}: stored rank_key {stored!r}, expected {expected!r}")
    return problems


def claim_choice() -> int | None:
    """The job the claim of a sole GPU would choose now: `rank` over every
    line head."""
    policy = policy_get()
    heads = [job_candidate(job) for job in queued_lane_heads()]
    if not heads:
        return None
    ranked = rank(
        heads,
        now=db_now().timestamp(),
        resident_model=sole_gpu_resident_model(),
        settings=policy_settings(policy),
    )
    return ranked[0].candidate.job_id


def replayed_order(*, now: datetime, resident_model: str | None, limit: int) -> list[int]:
    """The dispatch order played forward from every queued job, read one by one.

    The forecast reads only the lines that can matter, in batches; this
    reads the whole queue the plain way, to check it.
    """
    clocks = {(lane.member_id, lane.band): lane.last_dispatched_at for lane in Lane.objects.all()}
    candidates = [
        job_candidate(job, lane_clock=clocks.get((job.member_id, job.priority)))
        for job in queued_jobs().defer("body")
    ]
    paths = dict(Job.objects.filter(status=JobStatus.QUEUED).values_list("id", "path"))
    durations = Durations.load()
    order = play_forward(
        candidates,
        now=now.timestamp(),
        gpu_free_at=now.timestamp(),
        resident_model=resident_model,
        settings=policy_settings(policy_get()),
        run_seconds=lambda c: durations.run_seconds(c.model, paths[c.job_id]),
        swap_seconds=durations.swap_seconds,
        stop_after=limit,
    )
    return [place.job_id for place in order]


def queue_order_violations(state: dict[str, Any]) -> list[str]:
    """Problems with the queue as `GET /api/queue/` shows it to staff.

    Call it while nothing dispatches, so that the answer and what is read
    here describe the same queue.
    """
    queued = state["queued"]
    problems: list[str] = []
    try:
        check_invariant(policy_settings(policy_get()), tier_bonuses())
    except ValueError as exc:
        problems.append(f"policy breaks the band-spacing invariant: {exc}")
    positions = [entry["position"] for entry in queued]
    if positions != list(range(1, len(queued) + 1)):
        problems.append(f"positions are not 1..{len(queued)}: {positions[:10]} …")
    ids = [entry["id"] for entry in queued]
    if len(set(ids)) != len(ids):
        problems.append("a job is listed twice")
    jobs = {
        job.pk: job
        for job in Job.objects.filter(pk__in=ids).only(
            "member_id", "priority", "model", "submitted_at", "status"
        )
    }
    last_in_line: dict[tuple[int, int, str], tuple[Any, int]] = {}
    for job_id in ids:
        job = jobs.get(job_id)
        if job is None or job.status != JobStatus.QUEUED:
            problems.append(f"job {job_id} is listed as queued but is not")
            continue
        line = (job.member_id, job.priority, job.model)
        place = (job.submitted_at, job.pk)
        if line in last_in_line and last_in_line[line] > place:
            problems.append(f"job {job_id} is listed before an earlier job of its line")
        last_in_line[line] = place
    if queued:
        chosen = claim_choice()
        if chosen != queued[0]["id"]:
            problems.append(f"first listed is job {queued[0]['id']}; the claim would take {chosen}")
    if state["running"] is None:
        replayed = replayed_order(
            now=datetime.fromisoformat(state["as_of"]),
            resident_model=state["resident_model"],
            limit=len(queued),
        )
        if replayed != ids:
            differ = next(
                (i for i, (a, b) in enumerate(zip(replayed, ids, strict=False)) if a != b),
                min(len(ids), len(replayed)),
            )
            problems.append(
                f"listed order differs from the queue played forward from every queued job"
                f" at position {differ + 1}"
            )
    return problems
