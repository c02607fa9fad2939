"""'Why did my job wait?': the wait split into parts that add up to it.

The wait runs from submission to start (or to now while queued). The GPU
runs one job at a time, so every instant of the wait is one of:
- the job that was already running when this one arrived (jobs are never
  interrupted);
- a job dispatched ahead of this one, with the term that put it ahead (a
  model swap at its start is split out as its own part);
- the GPU idle: between two jobs, dispatch paused, or llama-swap unreachable.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Q

from queueapp.eta import Durations
from queueapp.models import DispatchDecision, Job, JobStatus, Member
from queueapp.policy import ScoreTerms, deciding_term
from queueapp.selectors import db_now

TERM_WORDS = {
    "band": "a higher band",
    "aging": "waited longer",
    "fairness": "its member's turn (your own jobs had just run)",
    "tier_bonus": "a higher tier",
    "swap_affinity": "its model was already loaded",
    "submission order": "submitted earlier",
    "your earlier job": "your own earlier job",
}


@dataclass
class Span:
    start: datetime
    end: datetime

    @property
    def seconds(self) -> float:
        return max(0.0, (self.end - self.start).total_seconds())


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
    affinity = policy["swap_affinity_bonus"] if decision.resident_model == job.model else 0.0
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


def _job_ref(other: Job, viewer: Member, owner: Member) -> dict[str, Any]:
    visible = viewer.is_staff or other.member_id == viewer.pk
    return {
        "id": other.pk,
        "member": other.member.name if visible else None,
        "yours": other.member_id == owner.pk,
        "model": other.model,
        "band": other.priority,
        "path": other.path if visible else None,
    }


def _span(job: Job, window: Span, now: datetime) -> Span | None:
    if job.started_at is None:
        return None
    start = max(job.started_at, window.start)
    end = min(job.finished_at or now, window.end)
    return Span(start, end) if end > start else None


def job_why(*, job: Job, viewer: Member) -> dict[str, Any]:
    now = db_now()
    end = job.started_at or (job.finished_at if job.status == JobStatus.CANCELLED else None) or now
    window = Span(job.submitted_at, end)
    durations = Durations.load()
    parts: list[dict[str, Any]] = []
    covered: list[Span] = []

    running_then = (
        Job.objects.select_related("member__tier")
        .filter(started_at__lte=job.submitted_at)
        .exclude(pk=job.pk)
        .filter(
            Q(finished_at__gt=job.submitted_at)
            | Q(finished_at__isnull=True, status=JobStatus.RUNNING)
        )
        .order_by("-started_at")
        .first()
    )
    if running_then is not None and (span := _span(running_then, window, now)):
        covered.append(span)
        parts.append(
            {
                "kind": "running_when_submitted",
                "seconds": round(span.seconds, 3),
                "from": span.start.isoformat(),
                "to": span.end.isoformat(),
                "job": _job_ref(running_then, viewer, job.member),
                "reason": "already running when your job arrived; jobs are never interrupted",
            }
        )

    lane_starts = list(
        Job.objects.filter(
            member_id=job.member_id,
            priority=job.priority,
            started_at__gte=job.submitted_at - timedelta(days=1),
            started_at__lt=end,
        )
        .exclude(pk=job.pk)
        .values_list("started_at", flat=True)
    )
    decisions = (
        DispatchDecision.objects.select_related("job__member__tier")
        .filter(at__gt=job.submitted_at, at__lt=end)
        .exclude(job=job)
        .order_by("at", "id")
    )
    for decision in decisions:
        ahead = decision.job
        if running_then is not None and ahead.pk == running_then.pk:
            continue
        span = _span(ahead, window, now)
        if span is None:
            continue
        mine = _my_terms_at(job, decision, lane_starts)
        theirs = _terms(decision.terms)
        same_line = (
            ahead.member_id == job.member_id
            and ahead.priority == job.priority
            and ahead.model == job.model
            and ahead.submitted_at <= job.submitted_at
        )
        term = (
            "your earlier job"
            if same_line
            else deciding_term(theirs, mine, aging_divisor=decision.policy["aging_divisor"])
        )
        swap = 0.0
        if decision.swap_needed:
            swap = min(span.seconds, durations.swap_seconds(ahead.model))
        covered.append(span)
        parts.append(
            {
                "kind": "dispatched_ahead",
                "seconds": round(span.seconds - swap, 3),
                "swap_seconds": round(swap, 3),
                "from": span.start.isoformat(),
                "to": span.end.isoformat(),
                "job": _job_ref(ahead, viewer, job.member),
                "their_terms": decision.terms,
                "your_terms": mine.as_dict(),
                "deciding_term": term,
                "reason": TERM_WORDS.get(term, term),
                "decision": decision.pk,
            }
        )

    idle = _uncovered(window, covered)
    wait = window.seconds
    idle_seconds = sum(span.seconds for span in idle)
    if idle_seconds > 0:
        parts.append(
            {
                "kind": "gpu_idle",
                "seconds": round(idle_seconds, 3),
                "intervals": [{"from": s.start.isoformat(), "to": s.end.isoformat()} for s in idle],
                "reason": "no job running: between two jobs, dispatch paused, or llama-swap "
                "unreachable",
            }
        )
    own_swap = None
    own_decision = job.decisions.order_by("-id").first()
    if own_decision is not None and own_decision.swap_needed:
        own_swap = round(durations.swap_seconds(job.model), 3)
    return {
        "job": job.pk,
        "status": job.status,
        "model": job.model,
        "band": job.priority,
        "submitted_at": job.submitted_at.isoformat(),
        "started_at": job.started_at.isoformat() if job.started_at else None,
        "finished_at": job.finished_at.isoformat() if job.finished_at else None,
        "still_waiting": job.status == JobStatus.QUEUED,
        "measured_wait_seconds": round(wait, 3),
        "parts": parts,
        "parts_total_seconds": round(
            sum(p["seconds"] + p.get("swap_seconds", 0.0) for p in parts), 3
        ),
        "own_swap_seconds": own_swap,
        "summary": _summary(job, wait, parts, own_swap),
    }


def _uncovered(window: Span, covered: list[Span]) -> list[Span]:
    gaps, cursor = [], window.start
    for span in sorted(covered, key=lambda s: s.start):
        if span.start > cursor:
            gaps.append(Span(cursor, span.start))
        cursor = max(cursor, span.end)
    if window.end > cursor:
        gaps.append(Span(cursor, window.end))
    return [gap for gap in gaps if gap.seconds > 0]


def duration_words(seconds: float) -> str:
    if seconds < 10:
        return f"{seconds:.1f} s"
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes} min"
    if minutes:
        return f"{minutes} min {secs} s"
    return f"{secs} s"


def _band_words(band: int) -> str:
    return f"{band:+d}" if band else "0"


def _summary(job: Job, wait: float, parts: list[dict[str, Any]], own_swap: float | None) -> str:
    verb = "Waiting for" if job.status == JobStatus.QUEUED else "Waited"
    pieces = []
    for part in parts:
        if part["kind"] == "running_when_submitted":
            pieces.append(
                f"{duration_words(part['seconds'])} for a band {_band_words(part['job']['band'])} "
                f"{part['job']['model']} job already running (jobs are never interrupted)"
            )
    ahead = [p for p in parts if p["kind"] == "dispatched_ahead"]
    groups: dict[str, list[dict[str, Any]]] = {}
    for part in ahead:
        groups.setdefault(part["deciding_term"], []).append(part)
    for term, group in groups.items():
        seconds = sum(p["seconds"] + p["swap_seconds"] for p in group)
        count = f"{len(group)} job{'s' if len(group) > 1 else ''}"
        if term == "band":
            bands = sorted({p["job"]["band"] for p in group}, reverse=True)
            higher = ", ".join(_band_words(b) for b in bands)
            detail = f"band {higher} vs your {_band_words(job.priority)}"
        else:
            detail = TERM_WORDS.get(term, term)
        pieces.append(f"{duration_words(seconds)} behind {count} ({detail})")
    swaps = sum(p["swap_seconds"] for p in ahead)
    if swaps > 0:
        pieces.append(f"of which about {duration_words(swaps)} loading other models")
    idle = next((p for p in parts if p["kind"] == "gpu_idle"), None)
    if idle and idle["seconds"] >= 1:
        pieces.append(f"{duration_words(idle['seconds'])} with the GPU idle")
    sentence = f"{verb} {duration_words(wait)}"
    if pieces:
        sentence += ": " + "; ".join(pieces)
    sentence += "."
    if own_swap:
        sentence += f" Its own start then loaded {job.model} (about {duration_words(own_swap)})."
    return sentence
