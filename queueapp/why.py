"""'Why did my job wait?': the wait split into parts that add up to it.

The wait runs from submission to start (or to now while queued). The GPU
runs one job at a time, so every instant of the wait is one of:
- the job that was already running when this one arrived (jobs are never
  interrupted);
- a job dispatched ahead of this one, with the term that put it ahead (a
  model swap at its start is split out as its own part);
- llama-swap or the dispatcher away: a dispatch that llama-swap refused (or
  whose dispatcher died) until the next dispatch;
- the member's own jobs running elsewhere: the GPU stood idle while the
  member had as many jobs running as their tier allows;
- the GPU idle: between two jobs, dispatch paused, or nothing dispatched.

A job can be dispatched more than once; each attempt's span runs from its
decision to the event that ended it, so none is counted twice.

With several GPUs the wait is told on one GPU's timeline, so the parts
still add up to it: the GPU the job ran on, or, while it waits, the one the
forecast expects it on (else the first that runs its model). The answer's
`gpus` say what every other GPU was doing: not serving the model, disabled,
down, or busy with other jobs (how many, and how long).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from queueapp.eta import Durations, queue_forecast
from queueapp.models import DispatchDecision, Gpu, Job, JobEvent, JobStatus, Member
from queueapp.policy import ScoreTerms, deciding_term
from queueapp.policy.score import affinity_bonus
from queueapp.selectors import db_now, gpus_list

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
    affinity = affinity_bonus(
        job.model, resident_model=decision.resident_model, bonus=policy["swap_affinity_bonus"]
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


@dataclass
class _Attempt:
    """One dispatch of a job: from its decision to the event that ended it."""

    decision: DispatchDecision
    span: Span
    ended_by: str  # an ATTEMPT_ENDS kind, or the job's status for its current attempt
    detail: dict[str, Any]


def _attempts(decisions: list[DispatchDecision], now: datetime) -> list[_Attempt]:
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
                (now, "unknown", {}),  # its events were pruned
            )
        attempts.append(_Attempt(decision, Span(decision.at, end[0]), end[1], end[2]))
    return attempts


def _clip(span: Span, window: Span) -> Span | None:
    start, end = max(span.start, window.start), min(span.end, window.end)
    return Span(start, end) if end > start else None


def _unavailable_part(attempt: _Attempt, span: Span, viewer: Member, owner: Member) -> dict:
    ahead = attempt.decision.job
    if attempt.ended_by == JobEvent.Kind.REQUEUED:
        kind = "dispatcher_unavailable"
        reason = (
            "the dispatcher stopped while running this job; its lease expired and the job "
            "went back to the queue"
        )
    else:
        kind = "upstream_unavailable"
        reason = (
            "llama-swap did not take this job "
            f"({attempt.detail.get('reason') or 'refused'}); it went back to the queue "
            "and the dispatcher retried"
        )
    return {
        "kind": kind,
        "seconds": round(span.seconds, 3),
        "from": span.start.isoformat(),
        "to": span.end.isoformat(),
        "job": _job_ref(ahead, viewer, owner),
        "reason": reason,
        "decision": attempt.decision.pk,
    }


def _explained_gpu(job: Job, gpus: list[Gpu]) -> Gpu | None:
    """The GPU whose timeline tells the wait: the one the job ran on (its
    last decision's), else the one the forecast expects, else the first
    that runs its model. None without GPUs, or when no GPU runs it."""
    if not gpus:
        return None
    decided = job.decisions.order_by("-id").values_list("gpu_id", flat=True).first()
    by_id = {gpu.pk: gpu for gpu in gpus}
    if decided in by_id:
        return by_id[decided]
    running = [gpu for gpu in gpus if _runs(gpu, job.model, alone=len(gpus) == 1)]
    if job.status == JobStatus.QUEUED and len(running) > 1:
        place = queue_forecast(include=[job]).for_job(job.pk)
        expected = next((gpu for gpu in running if place and gpu.name == place.gpu), None)
        if expected is not None:
            return expected
    return running[0] if running else None


def _runs(gpu: Gpu, model: str, *, alone: bool) -> bool:
    models = gpu.runs_models(alone=alone)
    return models is None or model in models


def _other_gpus(
    job: Job, gpus: list[Gpu], explained: Gpu | None, window: Span, now: datetime
) -> list[dict[str, Any]]:
    """What each GPU but the explained one did while the job waited."""
    others = []
    for gpu in gpus:
        if explained is not None and gpu.pk == explained.pk:
            continue
        entry: dict[str, Any] = {"gpu": gpu.name}
        if not _runs(gpu, job.model, alone=False):
            entry.update(state="does_not_serve", reason=f"does not serve {job.model}")
        elif not gpu.enabled:
            entry.update(state="disabled", reason="disabled by the operator")
        elif gpu.checked_at is not None and not gpu.reachable:
            entry.update(state="down", reason="its llama-swap does not answer")
        else:
            ran = [
                attempt.span
                for attempt in _attempts(
                    list(
                        DispatchDecision.objects.select_related("job")
                        .filter(gpu=gpu, at__lt=window.end)
                        .exclude(job=job)
                        .order_by("at", "id")
                    ),
                    now,
                )
                if _clip(attempt.span, window)
            ]
            busy = sum(span.seconds for span in (_clip(s, window) for s in ran) if span)
            entry.update(
                state="busy",
                jobs=len(ran),
                busy_seconds=round(busy, 3),
                reason=f"ran {len(ran)} other job{'s' if len(ran) != 1 else ''} "
                f"({duration_words(busy)}) while yours waited",
            )
        others.append(entry)
    return others


def job_why(*, job: Job, viewer: Member) -> dict[str, Any]:
    now = db_now()
    end = job.started_at or (job.finished_at if job.status == JobStatus.CANCELLED else None) or now
    window = Span(job.submitted_at, end)
    durations = Durations.load()
    parts: list[dict[str, Any]] = []
    covered: list[Span] = []
    gpus = gpus_list()
    explained = _explained_gpu(job, gpus)

    decisions = DispatchDecision.objects.select_related("job__member__tier").exclude(job=job)
    if len(gpus) > 1 and explained is not None:
        decisions = decisions.filter(gpu=explained)
    # The dispatch that held the GPU when this job arrived, then those taken
    # while it waited.
    before = decisions.filter(at__lte=job.submitted_at).order_by("-at", "-id").first()
    during = list(decisions.filter(at__gt=job.submitted_at, at__lt=end).order_by("at", "id"))
    attempts = _attempts(([before] if before else []) + during, now)
    # The next dispatch after an undone one: the GPU stayed idle until then
    # because llama-swap or the dispatcher was away.
    next_start = {
        attempt.decision.pk: later.decision.at
        for attempt, later in zip(attempts, attempts[1:], strict=False)
    }

    if before is not None and attempts[0].span.end > job.submitted_at:
        running_then = attempts.pop(0)
        span = _clip(running_then.span, window)
        if running_then.ended_by in (JobEvent.Kind.RETURNED_TO_QUEUE, JobEvent.Kind.REQUEUED):
            span = _clip(Span(job.submitted_at, next_start.get(before.pk, end)), window)
            if span:
                covered.append(span)
                parts.append(_unavailable_part(running_then, span, viewer, job.member))
        elif span:
            covered.append(span)
            parts.append(
                {
                    "kind": "running_when_submitted",
                    "seconds": round(span.seconds, 3),
                    "from": span.start.isoformat(),
                    "to": span.end.isoformat(),
                    "job": _job_ref(running_then.decision.job, viewer, job.member),
                    "reason": "already running when your job arrived; jobs are never interrupted",
                }
            )
    elif before is not None:
        attempts.pop(0)

    lane_starts = list(
        DispatchDecision.objects.filter(
            job__member_id=job.member_id,
            band=job.priority,
            at__gte=job.submitted_at - timedelta(days=1),
            at__lt=end,
        )
        .exclude(job=job)
        .values_list("at", flat=True)
    )
    for attempt in attempts:
        decision, ahead = attempt.decision, attempt.decision.job
        if attempt.ended_by in (JobEvent.Kind.RETURNED_TO_QUEUE, JobEvent.Kind.REQUEUED):
            span = _clip(Span(decision.at, next_start.get(decision.pk, end)), window)
            if span:
                covered.append(span)
                parts.append(_unavailable_part(attempt, span, viewer, job.member))
            continue
        span = _clip(attempt.span, window)
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
    held, idle = _held_by_running_limit(job, idle, now)
    if held:
        limit = job.member.tier.max_running_jobs
        parts.append(
            {
                "kind": "running_limit",
                "seconds": round(sum(span.seconds for span in held), 3),
                "intervals": [{"from": s.start.isoformat(), "to": s.end.isoformat()} for s in held],
                "reason": f"your own {'job was' if limit == 1 else f'{limit} jobs were'} running: "
                f"tier {job.member.tier.name} runs {limit} of a member's jobs at once",
            }
        )
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
    other_gpus = _other_gpus(job, gpus, explained, window, now) if len(gpus) > 1 else []
    return {
        "job": job.pk,
        "status": job.status,
        "model": job.model,
        "gpu": explained.name if explained is not None else None,
        "other_gpus": other_gpus,
        "band": job.priority,
        "submitted_at": job.submitted_at.isoformat(),
        "started_at": job.started_at.isoformat() if job.started_at else None,
        "finished_at": job.finished_at.isoformat() if job.finished_at else None,
        "still_waiting": job.status == JobStatus.QUEUED,
        "as_of": now.isoformat(),
        "measured_wait_seconds": round(wait, 3),
        "parts": parts,
        "parts_total_seconds": round(
            sum(p["seconds"] + p.get("swap_seconds", 0.0) for p in parts), 3
        ),
        "own_swap_seconds": own_swap,
        "summary": _summary(job, wait, parts, own_swap, explained, other_gpus),
    }


def _held_by_running_limit(
    job: Job, idle: list[Span], now: datetime
) -> tuple[list[Span], list[Span]]:
    """`idle` split into the spans when the member already had as many jobs
    running as their tier allows (on any GPU), and the rest."""
    if not idle:
        return [], []
    limit = job.member.tier.max_running_jobs
    others = (
        Job.objects.filter(member_id=job.member_id, started_at__lt=idle[-1].end)
        .exclude(pk=job.pk)
        .exclude(finished_at__lte=idle[0].start)
        .values_list("started_at", "finished_at")
    )
    # Where the member's running count reaches the limit: a sweep over starts and ends.
    spans = [(start, end or now) for start, end in others if start is not None]
    edges = sorted(
        [(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans],
        key=lambda edge: (edge[0], edge[1]),
    )
    capped: list[Span] = []
    running, since = 0, None
    for at, step in edges:
        running += step
        if running >= limit and since is None:
            since = at
        elif running < limit and since is not None:
            capped.append(Span(since, at))
            since = None
    held = [part for span in idle for cap in capped if (part := _clip(cap, span))]
    return held, [rest for span in idle for rest in _uncovered(span, held)]


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


def _summary(
    job: Job,
    wait: float,
    parts: list[dict[str, Any]],
    own_swap: float | None,
    explained: Gpu | None,
    other_gpus: list[dict[str, Any]],
) -> str:
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
    away = {
        "upstream_unavailable": "with llama-swap unavailable",
        "dispatcher_unavailable": "with the dispatcher stopped",
    }
    for kind, words in away.items():
        seconds = sum(p["seconds"] for p in parts if p["kind"] == kind)
        if seconds >= 1:
            pieces.append(f"{duration_words(seconds)} {words}")
    held = next((p for p in parts if p["kind"] == "running_limit"), None)
    if held and held["seconds"] >= 1:
        pieces.append(f"{duration_words(held['seconds'])} while your own job ran elsewhere")
    idle = next((p for p in parts if p["kind"] == "gpu_idle"), None)
    if idle and idle["seconds"] >= 1:
        pieces.append(f"{duration_words(idle['seconds'])} with the GPU idle")
    sentence = f"{verb} {duration_words(wait)}"
    if other_gpus and explained is not None:
        sentence += f" for a GPU serving {job.model}, on {explained.name}"
    if pieces:
        sentence += ": " + "; ".join(pieces)
    sentence += "."
    if other_gpus:
        sentence += " " + "; ".join(f"{o['gpu']} {o['reason']}" for o in other_gpus) + "."
    if own_swap:
        sentence += f" Its own start then loaded {job.model} (about {duration_words(own_swap)})."
    return sentence
