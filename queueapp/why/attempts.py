"""Dispatch attempts: each decision's span on the GPU, from the decision to
the event that ended it. A job dispatched more than once keeps only its last
start on its row, so the earlier attempts end where its events say."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from queueapp.models import DispatchDecision, JobEvent
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
    events = JobEvent.objects.filter(
        job_id__in={decision.job_id for decision in decisions},
        kind__in=ATTEMPT_ENDS,
        at__gte=min(decision.at for decision in decisions),
    ).order_by("at", "id")
    for event in events:
        ends.setdefault(event.job_id, []).append((event.at, event.kind, event.detail))
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
