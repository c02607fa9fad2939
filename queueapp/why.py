"""'Why did my job wait?': the wait split into parts that add up to it.

The wait runs from submission to start (or to now while queued). Every
instant of the wait is one of:
- a job that was already running when this one arrived (jobs are never
  interrupted);
- a job dispatched ahead of this one, with the term that put it ahead (a
  model swap at its start is split out as its own part);
- llama-swap or the dispatcher away: a dispatch that llama-swap refused (or
  whose dispatcher died) until the next dispatch;
- a drain: jobs of a model with parallel slots still in flight while the GPU
  waits for them all to end before it swaps to another model (a GPU changes
  model only when nothing runs on it, and admits no new job of the resident
  model while one of another model comes first);
- the member's own jobs running elsewhere: the GPU stood idle while the
  member held as many GPUs as their tier allows;
- the GPU idle: between two jobs, dispatch paused, or nothing dispatched.

Jobs of a batchable model share the GPU, so their runs overlap: the wait is
cut at every start and end on the GPU and each piece is counted once, shared
equally by the jobs running through it (or given whole to the drain it is
part of). One job at a time, each piece has one job, and a job's part is its
whole run inside the wait.

A job can be dispatched more than once; each attempt's span runs from its
decision to the event that ended it, so none is counted twice.

With several GPUs the wait is told on one GPU's timeline, so the parts
still add up to it: the GPU the job ran on, or, while it waits, the one the
forecast expects it on (else the first that runs its model). The answer's
`gpus` say what every other GPU was doing: not serving the model, disabled,
down, or busy with other jobs (how many, and how long).
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from django.db.models import F, Q

from queueapp.eta import Durations, queue_forecast
from queueapp.models import (
    DispatchDecision,
    Gpu,
    Job,
    JobEvent,
    JobStatus,
    Member,
    ModelSetting,
)
from queueapp.policy import ScoreTerms, deciding_term
from queueapp.policy.score import affinity_bonus
from queueapp.selectors import db_now, gpus_list


class PartKind(StrEnum):
    """What held this job back during one stretch of its wait."""

    RUNNING_WHEN_SUBMITTED = "running_when_submitted"
    DISPATCHED_AHEAD = "dispatched_ahead"
    UPSTREAM_UNAVAILABLE = "upstream_unavailable"
    DISPATCHER_UNAVAILABLE = "dispatcher_unavailable"
    DRAIN = "drain"
    RUNNING_LIMIT = "running_limit"
    GPU_IDLE = "gpu_idle"


# Attempts undone before llama-swap answered: the job went back to the queue.
UNDONE = (JobEvent.Kind.RETURNED_TO_QUEUE, JobEvent.Kind.REQUEUED)


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


def _unavailable_part(
    attempt: _Attempt, span: Span, seconds: float, viewer: Member, owner: Member
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
                span
                for attempt in _attempts(
                    list(
                        DispatchDecision.objects.select_related("job")
                        .filter(gpu=gpu, at__lt=window.end)
                        .exclude(job=job)
                        .order_by("at", "id")
                    ),
                    now,
                )
                if (span := _clip(attempt.span, window))
            ]
            # Jobs that ran at once count once.
            busy = sum(piece.seconds for piece, _ in _pieces(ran))
            entry.update(
                state="busy",
                jobs=len(ran),
                busy_seconds=round(busy, 3),
                reason=f"ran {len(ran)} other job{'s' if len(ran) != 1 else ''} "
                f"({duration_words(busy)}) while yours waited",
            )
        others.append(entry)
    return others


@dataclass
class _Hold:
    """One attempt holding the GPU during the wait, and its share of it."""

    attempt: _Attempt
    span: Span  # inside the wait
    kind: PartKind
    seconds: float = 0.0  # its share of each instant of `span`, drains left out
    shared: bool = False  # some of `span` was shared with other jobs or a drain
    beside: int = 0  # the most other jobs that ran beside it


@dataclass
class _Drain:
    """A stretch of the wait when jobs of `model` were in flight and the GPU
    took no new one of them: it waited for them all to end before swapping
    to `swap_to`'s model (None: no swap yet, this job still waits)."""

    model: str
    swap_to: Job | None
    spans: list[Span]
    in_flight: int
    jobs: list[Job]


def _pieces(spans: list[Span]) -> list[tuple[Span, list[int]]]:
    """The stretches between consecutive starts and ends of `spans`, each
    with the indices of the spans running through it (none: left out)."""
    begins: dict[datetime, list[int]] = {}
    ends: dict[datetime, list[int]] = {}
    for index, span in enumerate(spans):
        begins.setdefault(span.start, []).append(index)
        ends.setdefault(span.end, []).append(index)
    edges = sorted(begins.keys() | ends.keys())
    running: set[int] = set()
    pieces = []
    for start, end in zip(edges, edges[1:], strict=False):
        running.difference_update(ends.get(start, []))
        running.update(begins.get(start, []))
        if running:
            pieces.append((Span(start, end), sorted(running)))
    return pieces


def _draining(
    holds: list[_Hold],
    piece: Span,
    next_starts: list[DispatchDecision],
    job: Job,
    parallel: dict[str, int],
) -> tuple[str, DispatchDecision | None] | None:
    """(the resident model, the start it drains for) when `piece` is part of a
    drain: only jobs of one model ran, a model whose jobs share the GPU, and
    the next start on the GPU is another model's (or none yet while this job,
    of another model, waits). None otherwise."""
    if any(
        hold.kind not in (PartKind.RUNNING_WHEN_SUBMITTED, PartKind.DISPATCHED_AHEAD)
        for hold in holds
    ):
        return None
    models = {hold.attempt.decision.job.model for hold in holds}
    if len(models) != 1:
        return None
    model = models.pop()
    if len(holds) == 1 and parallel.get(model, 1) <= 1:
        return None  # one job at a time: the job's own part
    at = bisect_left(next_starts, piece.end, key=lambda decision: decision.at)
    following = next_starts[at] if at < len(next_starts) else None
    if following is None:
        return (model, None) if job.model != model else None
    return (model, following) if following.job.model != model else None


def _drain_part(drain: _Drain, job: Job, viewer: Member) -> dict[str, Any]:
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
        "jobs": [_job_ref(other, viewer, job.member) for other in drain.jobs],
        "swap_to": _job_ref(drain.swap_to, viewer, job.member) if drain.swap_to else None,
        "for_you": drain.swap_to is not None and drain.swap_to.pk == job.pk,
        "reason": reason,
    }


def _share_out(
    holds: list[_Hold],
    next_starts: list[DispatchDecision],
    job: Job,
    parallel: dict[str, int],
) -> list[_Drain]:
    """Each instant of the holds' spans counted once: given to the drain it
    is part of, else shared equally by the holds running through it (their
    `seconds`). The drains, in order."""
    drains: dict[int | None, _Drain] = {}
    for piece, running in _pieces([hold.span for hold in holds]):
        sharing = [holds[index] for index in running]
        draining = _draining(sharing, piece, next_starts, job, parallel)
        if draining is not None:
            model, swap = draining
            drain = drains.setdefault(
                swap.pk if swap else None, _Drain(model, swap.job if swap else None, [], 0, [])
            )
            if drain.spans and drain.spans[-1].end == piece.start:
                drain.spans[-1] = Span(drain.spans[-1].start, piece.end)
            else:
                drain.spans.append(piece)
            drain.in_flight = max(drain.in_flight, len(sharing))
            drain.jobs += [
                h.attempt.decision.job for h in sharing if h.attempt.decision.job not in drain.jobs
            ]
        for hold in sharing:
            if draining is None:
                hold.seconds += piece.seconds / len(sharing)
            if draining is not None or len(sharing) > 1:
                hold.shared = True
                hold.beside = max(hold.beside, len(sharing) - 1)
    return list(drains.values())


def _hold_part(
    hold: _Hold,
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
            "job": _job_ref(ahead, viewer, job.member),
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
    term = (
        "your earlier job"
        if same_line
        else deciding_term(theirs, mine, aging_divisor=decision.policy["aging_divisor"])
    )
    swap = 0.0
    if decision.swap_needed:
        swap = min(hold.seconds, durations.swap_seconds(ahead.model))
    return {
        "kind": PartKind.DISPATCHED_AHEAD,
        "seconds": round(hold.seconds - swap, 3),
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


def job_why(*, job: Job, viewer: Member) -> dict[str, Any]:
    now = db_now()
    end = job.started_at or (job.finished_at if job.status == JobStatus.CANCELLED else None) or now
    window = Span(job.submitted_at, end)
    durations = Durations.load()
    parts: list[dict[str, Any]] = []
    gpus = gpus_list()
    explained = _explained_gpu(job, gpus)

    decisions = DispatchDecision.objects.select_related("job__member__tier").exclude(job=job)
    own_decisions = job.decisions.select_related("job")
    if len(gpus) > 1 and explained is not None:
        decisions = decisions.filter(gpu=explained)
        own_decisions = own_decisions.filter(gpu=explained)
    # The dispatches that held the GPU when this job arrived (the last one,
    # and with parallel slots every job still running then), then those
    # taken while it waited.
    earlier = decisions.filter(at__lte=job.submitted_at)
    last = earlier.order_by("-at", "-id").first()
    before = {last} if last else set()
    if last is not None:
        before.update(
            earlier.filter(at=F("job__started_at")).filter(
                Q(job__status=JobStatus.RUNNING) | Q(job__finished_at__gt=job.submitted_at)
            )
        )
    during = list(decisions.filter(at__gt=job.submitted_at, at__lt=end).order_by("at", "id"))
    attempts = _attempts(sorted(before, key=lambda d: (d.at, d.pk)) + during, now)
    # The next dispatch after an undone one: the GPU stayed idle until then
    # because llama-swap or the dispatcher was away.
    next_start = {
        attempt.decision.pk: later.decision.at
        for attempt, later in zip(attempts, attempts[1:], strict=False)
    }

    holds: list[_Hold] = []
    for attempt in attempts:
        decision = attempt.decision
        arrived_first = decision.at <= job.submitted_at
        if arrived_first and attempt.span.end <= job.submitted_at:
            continue
        if attempt.ended_by in UNDONE:
            span = _clip(Span(decision.at, next_start.get(decision.pk, end)), window)
            kind = (
                PartKind.DISPATCHER_UNAVAILABLE
                if attempt.ended_by == JobEvent.Kind.REQUEUED
                else PartKind.UPSTREAM_UNAVAILABLE
            )
        else:
            span = _clip(attempt.span, window)
            kind = PartKind.RUNNING_WHEN_SUBMITTED if arrived_first else PartKind.DISPATCHED_AHEAD
        if span:
            holds.append(_Hold(attempt, span, kind))

    # Each instant once: shared by the jobs running through it, or its drain's.
    models = {job.model} | {hold.attempt.decision.job.model for hold in holds}
    parallel = dict(ModelSetting.objects.filter(name__in=models).values_list("name", "parallel"))
    next_starts = sorted(
        [*during, *own_decisions.filter(at__gte=job.submitted_at)], key=lambda d: (d.at, d.pk)
    )
    drains = _share_out(holds, next_starts, job, parallel)

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
    for hold in holds:
        part = _hold_part(hold, job, viewer, lane_starts, durations)
        if part is None:
            continue
        if hold.shared:
            # Its own run inside the wait, of which `seconds` is its share.
            part["wall_seconds"] = round(hold.span.seconds, 3)
            part["shared_with"] = hold.beside
        parts.append(part)
    parts += [_drain_part(drain, job, viewer) for drain in drains]

    idle = _uncovered(window, [hold.span for hold in holds])
    held, idle = _held_by_running_limit(job, idle, now)
    if held:
        limit = job.member.tier.max_running_jobs
        parts.append(
            {
                "kind": PartKind.RUNNING_LIMIT,
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
                "kind": PartKind.GPU_IDLE,
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
    # Its own start: the slot it took and the jobs on the GPU with it.
    started = own_decision if own_decision and own_decision.at == job.started_at else None
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
        "slot": started.gpu_slot if started else None,
        "in_flight": started.in_flight if started else None,
        "summary": _summary(job, wait, parts, own_swap, explained, other_gpus, started),
    }


def _held_by_running_limit(
    job: Job, idle: list[Span], now: datetime
) -> tuple[list[Span], list[Span]]:
    """`idle` split into the spans when the member already held as many GPUs
    as their tier allows, and the rest. Jobs of theirs sharing one GPU (its
    slots) hold one, as the claim counts them."""
    if not idle:
        return [], []
    limit = job.member.tier.max_running_jobs
    others = (
        Job.objects.filter(member_id=job.member_id, started_at__lt=idle[-1].end)
        .exclude(pk=job.pk)
        .exclude(finished_at__lte=idle[0].start)
        .values_list("pk", "gpu_id", "started_at", "finished_at")
    )
    by_gpu: dict[tuple[str, int], list[tuple[datetime, datetime]]] = {}
    for pk, gpu_id, start, end in others:
        if start is not None:
            key = ("gpu", gpu_id) if gpu_id is not None else ("job", pk)
            by_gpu.setdefault(key, []).append((start, end or now))
    # Where the member's GPUs held reach the limit: a sweep over starts and ends.
    spans = [span for runs in by_gpu.values() for span in _overlaps_merged(runs)]
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


def _overlaps_merged(runs: list[tuple[datetime, datetime]]) -> list[tuple[datetime, datetime]]:
    """`runs` with those that overlap made one (those that only touch stay apart)."""
    merged: list[tuple[datetime, datetime]] = []
    for start, end in sorted(runs):
        if merged and start < merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


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
    started: DispatchDecision | None,
) -> str:
    verb = "Waiting for" if job.status == JobStatus.QUEUED else "Waited"
    pieces = []
    running = [p for p in parts if p["kind"] == PartKind.RUNNING_WHEN_SUBMITTED]
    if len(running) == 1:
        (part,) = running
        pieces.append(
            f"{duration_words(part['seconds'])} for a band {_band_words(part['job']['band'])} "
            f"{part['job']['model']} job already running (jobs are never interrupted)"
        )
    elif running:
        seconds = sum(p["seconds"] for p in running)
        pieces.append(
            f"{duration_words(seconds)} for {len(running)} jobs already running "
            "(jobs are never interrupted)"
        )
    ahead = [p for p in parts if p["kind"] == PartKind.DISPATCHED_AHEAD]
    groups: dict[str, list[dict[str, Any]]] = {}
    for part in ahead:
        if "wall_seconds" in part and part["seconds"] + part["swap_seconds"] <= 0:
            continue  # all its time was a drain, told below
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
    pieces += [
        _drain_words(part, job, ahead={p["job"]["id"] for p in ahead})
        for part in parts
        if part["kind"] == PartKind.DRAIN
    ]
    away = {
        PartKind.UPSTREAM_UNAVAILABLE: "with llama-swap unavailable",
        PartKind.DISPATCHER_UNAVAILABLE: "with the dispatcher stopped",
    }
    for kind, words in away.items():
        seconds = sum(p["seconds"] for p in parts if p["kind"] == kind)
        if seconds >= 1:
            pieces.append(f"{duration_words(seconds)} {words}")
    held = next((p for p in parts if p["kind"] == PartKind.RUNNING_LIMIT), None)
    if held and held["seconds"] >= 1:
        pieces.append(f"{duration_words(held['seconds'])} while your own job ran elsewhere")
    idle = next((p for p in parts if p["kind"] == PartKind.GPU_IDLE), None)
    if idle and idle["seconds"] >= 1:
        pieces.append(f"{duration_words(idle['seconds'])} with the GPU idle")
    sentence = f"{verb} {duration_words(wait)}"
    if other_gpus and explained is not None:
        sentence += f" for a GPU serving {job.model}, on {explained.name}"
    if pieces:
        sentence += ": " + "; ".join(pieces)
    sentence += "."
    if any(p.get("shared_with") for p in parts):
        sentence += " Jobs that ran at once share the time they ran."
    if started is not None and started.in_flight > 1:
        others = started.in_flight - 1
        sentence += (
            f" It started in slot {started.gpu_slot}, beside {others} other "
            f"{job.model} job{'s' if others != 1 else ''} on the GPU."
        )
    if other_gpus:
        sentence += " " + "; ".join(f"{o['gpu']} {o['reason']}" for o in other_gpus) + "."
    if own_swap:
        sentence += f" Its own start then loaded {job.model} (about {duration_words(own_swap)})."
    return sentence


def _drain_words(part: dict[str, Any], job: Job, *, ahead: set[int]) -> str:
    count = part["in_flight"]
    requests = f"{count} {part['model']} request{'s' if count != 1 else ''}"
    if part["for_you"]:
        words = f"waiting for {requests} in flight to end before the swap to {job.model}"
    elif part["swap_to"] is not None and job.model == part["model"]:
        words = (
            f"held back while the GPU drained {requests} before the swap to "
            f"{part['swap_to']['model']}"
        )
    else:
        words = f"waiting for {requests} in flight to end before a swap"
    dispatched = sum(1 for other in part["jobs"] if other["id"] in ahead)
    if dispatched:
        words += f" ({dispatched} of them dispatched ahead of yours)"
    return f"{duration_words(part['seconds'])} {words}"
