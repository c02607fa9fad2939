"""The parts a hold or a drain makes: the job already running, the one
dispatched ahead with its terms next to this job's (its model swap split
out), llama-swap or the dispatcher away, and the drain before a swap."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from queueapp.durations import Durations
from queueapp.models import DispatchDecision, Job, JobEvent, Member
from queueapp.policy import ScoreTerms, deciding_term
from queueapp.policy.score import affinity_bonus
from queueapp.why.attempts import UNRECORDED, Attempt
from queueapp.why.kinds import TERM_WORDS, PartKind
from queueapp.why.shared_time import Drain, Hold
from queueapp.why.spans import Span


def _terms(data: dict[str, Any]) -> ScoreTerms:
    return ScoreTerms(
        band=data["band"],
        tier_bonus=data["tier_bonus"],
        swap_affinity=data["swap_affinity"],
        aging=data["aging"],
        effective=data["effective"],
        waited_seconds=data.get("waited_seconds", 0.0),
        aged_seconds=data.get("aged_seconds", data.get("waited_seconds", 0.0)),
    )


def _my_terms_at(job: Job, decision: DispatchDecision, lane_starts: list[datetime]) -> ScoreTerms:
    """This job's terms at the moment of another job's dispatch, recomputed
    with the policy recorded in that decision."""
    policy = decision.policy
    clock = max((start for start in lane_starts if start < decision.at), default=None)
    eligible = max(job.submitted_at, clock) if clock else job.submitted_at
    aged = max(0.0, (decision.at - eligible).total_seconds())
    affinity = affinity_bonus(
        job.model, resident_model=decision.loaded, bonus=policy["swap_affinity_bonus"]
    )
    aging = aged / policy["aging_divisor"]
    bonus = job.member.tier.bonus
    return ScoreTerms(
        band=job.priority,
        tier_bonus=bonus,
        swap_affinity=affinity,
        aging=aging,
        effective=job.priority + bonus + affinity + aging,
        waited_seconds=max(0.0, (decision.at - job.submitted_at).total_seconds()),
        aged_seconds=aged,
    )


def job_ref(other: Job, viewer: Member, owner: Member) -> dict[str, Any]:
    visible = viewer.is_staff or other.member_id == viewer.pk
    return {
        "id": other.pk,
        "member": other.member.name if visible else None,
        "yours": other.member_id == owner.pk,
        "model": other.model,
        "band": other.priority,
        "path": other.path if visible else None,
    }


_ATTEMPT_CUT_WORDS = {
    JobEvent.Kind.REQUEUED: "its dispatcher stopped and its lease expired",
    UNRECORDED: "its end was not recorded: counted to its next dispatch",
}


def own_attempt_part(hold: Hold, viewer: Member, job: Job) -> dict[str, Any]:
    """The job's own earlier attempt: it ran (or was being sent), then went
    back to the queue; that time is its own, not another job's."""
    attempt, span = hold.attempt, hold.span
    on = attempt.decision.gpu
    gpu = on.name if on is not None else "the GPU"
    if attempt.detail.get("cut_by_unload"):
        how = "cut by an unload"
    elif attempt.ended_by == JobEvent.Kind.RETURNED_TO_QUEUE:
        how = f"llama-swap did not take it ({attempt.detail.get('reason') or 'refused'})"
    else:
        how = _ATTEMPT_CUT_WORDS.get(attempt.ended_by, "it went back to the queue")
    return {
        "kind": PartKind.OWN_EARLIER_ATTEMPT,
        "seconds": round(hold.seconds, 3),
        "from": span.start.isoformat(),
        "to": span.end.isoformat(),
        "gpu": gpu,
        "job": job_ref(job, viewer, job.member),
        "reason": f"your own earlier attempt on {gpu}, {how}; the job went back to the queue",
        "decision": attempt.decision.pk,
    }


def _unavailable_part(
    attempt: Attempt, span: Span, seconds: float, viewer: Member, owner: Member
) -> dict:
    ahead = attempt.decision.job
    if attempt.ended_by == JobEvent.Kind.REQUEUED:
        kind = PartKind.DISPATCHER_UNAVAILABLE
        reason = (
            "the dispatcher stopped while running this job; its lease expired and the job "
            "went back to the queue"
        )
    else:
        kind = PartKind.UPSTREAM_UNAVAILABLE
        reason = (
            "llama-swap did not take this job "
            f"({attempt.detail.get('reason') or 'refused'}); it went back to the queue "
            "and the dispatcher retried"
        )
    return {
        "kind": kind,
        "seconds": round(seconds, 3),
        "from": span.start.isoformat(),
        "to": span.end.isoformat(),
        "job": job_ref(ahead, viewer, owner),
        "reason": reason,
        "decision": attempt.decision.pk,
    }


def drain_part(drain: Drain, job: Job, viewer: Member) -> dict[str, Any]:
    spans = drain.spans
    requests = f"{drain.in_flight} {drain.model} request{'s' if drain.in_flight != 1 else ''}"
    if drain.swap_to is not None and drain.swap_to.pk == job.pk:
        reason = (
            f"waiting for {requests} in flight to end before the swap to {job.model}: "
            "a GPU changes model only when nothing runs on it"
        )
    elif drain.swap_to is not None and job.model == drain.model:
        reason = (
            f"held back while the GPU drained for a higher-scored {drain.swap_to.model} job: "
            f"no new {drain.model} job starts while it waits; {requests} in flight had to end "
            "before the swap"
        )
    else:
        after = f" to {drain.swap_to.model}" if drain.swap_to is not None else ""
        reason = f"waiting for {requests} in flight to end before the swap{after}"
    return {
        "kind": PartKind.DRAIN,
        "seconds": round(sum(span.seconds for span in spans), 3),
        "intervals": [{"from": s.start.isoformat(), "to": s.end.isoformat()} for s in spans],
        "model": drain.model,
        "in_flight": drain.in_flight,
        "jobs": [job_ref(other, viewer, job.member) for other in drain.jobs],
        "swap_to": job_ref(drain.swap_to, viewer, job.member) if drain.swap_to else None,
        "for_you": drain.swap_to is not None and drain.swap_to.pk == job.pk,
        "reason": reason,
    }


def hold_part(
    hold: Hold,
    job: Job,
    viewer: Member,
    lane_starts: list[datetime],
    durations: Durations,
) -> dict[str, Any] | None:
    """The part a hold makes: the job already running, the one dispatched
    ahead (with its terms next to this job's), or llama-swap or the
    dispatcher away. None for a job already running whose whole time in the
    wait was a drain (the drain's part names it)."""
    attempt, span = hold.attempt, hold.span
    decision, ahead = attempt.decision, attempt.decision.job
    if hold.kind in (PartKind.UPSTREAM_UNAVAILABLE, PartKind.DISPATCHER_UNAVAILABLE):
        return _unavailable_part(attempt, span, hold.seconds, viewer, job.member)
    if hold.kind == PartKind.RUNNING_WHEN_SUBMITTED:
        if hold.seconds <= 0:
            return None
        return {
            "kind": PartKind.RUNNING_WHEN_SUBMITTED,
            "seconds": round(hold.seconds, 3),
            "from": span.start.isoformat(),
            "to": span.end.isoformat(),
            "job": job_ref(ahead, viewer, job.member),
            "reason": "already running when your job arrived; jobs are never interrupted",
        }
    mine = _my_terms_at(job, decision, lane_starts)
    theirs = _terms(decision.terms)
    same_line = (
        ahead.member_id == job.member_id
        and ahead.priority == job.priority
        and ahead.model == job.model
        and ahead.submitted_at <= job.submitted_at
    )
    # The member's own job of another line (another model, same band): a
    # turn between their own lines, never "its member's turn".
    own_line = ahead.member_id == job.member_id and ahead.priority == job.priority
    if same_line:
        term = "your earlier job"
    elif own_line:
        term = "your other line"
    else:
        term = deciding_term(theirs, mine, aging_divisor=decision.policy["aging_divisor"])
    reason = f"your own {ahead.model} job took its turn" if term == "your other line" else None
    swap = 0.0
    if decision.swap_needed:
        swap = min(hold.seconds, durations.swap_seconds(ahead.model))
    return {
        "kind": PartKind.DISPATCHED_AHEAD,
        "seconds": round(hold.seconds - swap, 3),
        "swap_seconds": round(swap, 3),
        "from": span.start.isoformat(),
        "to": span.end.isoformat(),
        "job": job_ref(ahead, viewer, job.member),
        "their_terms": decision.terms,
        "your_terms": mine.as_dict(),
        "deciding_term": term,
        "reason": reason or TERM_WORDS.get(term, term),
        "decision": decision.pk,
    }
