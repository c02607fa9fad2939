"""Dispatch attempts: each decision's span on the GPU, from the decision to
the event that ended it. A job dispatched more than once keeps only its last
start on its row, so the earlier attempts end where its events say."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Exists, OuterRef, Q, QuerySet

from queueapp.models import DispatchDecision, JobEvent, JobStatus
from queueapp.why.spans import Span

# Events that end a dispatch attempt: the answer came back, the job was
# cancelled or failed, llama-swap refused the body (the claim was undone), or
# the dispatcher's lease expired.
ATTEMPT_ENDS = (
    JobEvent.Kind.SUCCEEDED,
    JobEvent.Kind.FAILED,
    JobEvent.Kind.CANCELLED,
    JobEvent.Kind.RETURNED_TO_QUEUE,
    JobEvent.Kind.REQUEUED,
)

# Attempts undone before llama-swap answered: the job went back to the queue.
UNDONE = (JobEvent.Kind.RETURNED_TO_QUEUE, JobEvent.Kind.REQUEUED)


# What `why` reads of the decisions it explains a wait with, and of their
# jobs: the bodies, results, candidates and skip records stay in the
# database (a wait behind hundreds of decisions would build and decode them
# all). Reading a field left out costs a query per row: tests/why/ count them.
READ_DECISION_FIELDS = (
    "at",
    "job_id",
    "gpu_id",
    "band",
    "terms",
    "policy",
    "resident_model",
    "resident_models",
    "swap_needed",
    "swap",
    "gpu_slot",
    "in_flight",
    "borrowed",
    "job__member_id",
    "job__model",
    "job__priority",
    "job__path",
    "job__submitted_at",
    "job__started_at",
    "job__finished_at",
    "job__status",
)


def decisions_in(decisions: QuerySet[DispatchDecision], window: Span) -> QuerySet[DispatchDecision]:
    """The decisions of `decisions` whose attempt may overlap `window`:
    taken inside it, or before it by a job still running then (its current
    attempt, or an earlier one that ended inside the window). Older ones
    ended before the wait began, however long the history kept."""
    ended_inside = JobEvent.objects.filter(
        job_id=OuterRef("job_id"), kind__in=ATTEMPT_ENDS, at__gt=window.start
    )
    return (
        decisions.filter(at__lt=window.end)
        .filter(
            Q(at__gte=window.start)
            | Q(job__status=JobStatus.RUNNING)
            | Q(job__finished_at__gt=window.start)
            | Exists(ended_inside)
        )
        .only(*READ_DECISION_FIELDS)
    )


@dataclass
class Attempt:
    """One dispatch of a job: from its decision to the event that ended it."""

    decision: DispatchDecision
    span: Span
    # An ATTEMPT_ENDS kind, the job's status for its current attempt, or
    # UNRECORDED.
    ended_by: str
    detail: dict[str, Any]


def dispatch_attempts(decisions: list[DispatchDecision], now: datetime) -> list[Attempt]:
    """Each decision's attempt span, from the job's recorded events.

    A job may be dispatched more than once (llama-swap refused it, or its
    dispatcher died), and its row keeps only the last start: the events say
    when each earlier attempt ended, so no attempt is counted twice."""
    if not decisions:
        return []
    ends: dict[int, list[tuple[datetime, str, dict[str, Any]]]] = {}
    events = (
        JobEvent.objects.filter(
            job_id__in={decision.job_id for decision in decisions},
            kind__in=ATTEMPT_ENDS,
            at__gte=min(decision.at for decision in decisions),
        )
        .order_by("at", "id")
        .values_list("job_id", "at", "kind", "detail")
    )
    for job_id, at, kind, detail in events:
        ends.setdefault(job_id, []).append((at, kind, detail))
    attempts = []
    for decision in decisions:
        ahead = decision.job
        if ahead.started_at == decision.at:
            # The job's current attempt: its row has the exact finish.
            end: tuple[datetime, str, dict[str, Any]] = (ahead.finished_at or now, ahead.status, {})
        else:
            end = next(
                (
                    (at, kind, detail)
                    for at, kind, detail in ends.get(decision.job_id, [])
                    if at > decision.at
                ),
                None,
            ) or (_unrecorded_end(decision, decisions, now), UNRECORDED, {})
        attempts.append(Attempt(decision, Span(decision.at, end[0]), end[1], end[2]))
    return attempts


# An attempt with no event that ended it (its event was never written).
UNRECORDED = "unrecorded"


def _unrecorded_end(
    decision: DispatchDecision, decisions: list[DispatchDecision], now: datetime
) -> datetime:
    """Where an attempt without an ending event is taken to end: at its
    job's next dispatch (a job runs once at a time), else at its row's
    finish, else now. The answer clips it to the wait and says its end was
    not recorded."""
    later = [d.at for d in decisions if d.job_id == decision.job_id and d.at > decision.at]
    return min(later, default=None) or decision.job.finished_at or now
