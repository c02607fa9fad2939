"""The answer to 'why did my job wait?': the explained GPU's dispatches
during the wait turned into holds, the GPU's time shared out, each hold's and
drain's part, the running limit and idle time, and the summary.

`job_why` names the steps in the order they read the database; what they
share is the `_Wait` being explained."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import F, Q, QuerySet

from queueapp.durations import Durations
from queueapp.models import (
    DispatchDecision,
    Gpu,
    Job,
    JobEvent,
    JobStatus,
    Member,
    ModelSetting,
)
from queueapp.policy.facts import gpus_alone
from queueapp.policy.resident_sets import Swap, swap_from_json
from queueapp.policy.server_slots import Parallel, ParallelSource
from queueapp.selectors import db_now, gpus_list
from queueapp.why.attempts import (
    READ_DECISION_FIELDS,
    UNDONE,
    UNRECORDED,
    Attempt,
    dispatch_attempts,
)
from queueapp.why.cut import Cut, Owner, cut_wait
from queueapp.why.expected import expected_entry
from queueapp.why.kinds import PartKind
from queueapp.why.other_gpus import explained_gpu, other_gpus_during
from queueapp.why.parts import drain_part, hold_part, own_attempt_part
from queueapp.why.running_limit import LimitHeld, limit_during
from queueapp.why.shared_time import Drain, Hold, Piece, share_out
from queueapp.why.spans import Span, clip, uncovered
from queueapp.why.summary import wait_summary


@dataclass(frozen=True)
class _Wait:
    """The wait being explained: the job, the clock the answer is told at,
    the stretch from submission to start (or cancel, or now), the GPUs and
    the one whose dispatches explain it."""

    job: Job
    now: datetime
    window: Span
    gpus: list[Gpu]
    explained: Gpu | None

    @property
    def end(self) -> datetime:
        return self.window.end


@dataclass(frozen=True)
class _OwnStart:
    """The job's own last dispatch, as the answer tells it: the model load it
    paid, and the slot it took when that dispatch is the start it waited for."""

    swap_seconds: float | None
    started: DispatchDecision | None
    # What llama-swap's routing was predicted to load and unload for it.
    swap: Swap | None = None


def job_why(*, job: Job, viewer: Member, as_of: datetime | None = None) -> dict[str, Any]:
    """The answer told as of `as_of` (a past instant of a queued job's wait,
    checked by the caller), else as of the database's now."""
    now = as_of or db_now()
    durations = Durations.load()
    gpus = gpus_list()
    wait = _Wait(
        job=job,
        now=now,
        window=Span(job.submitted_at, _wait_end(job, now)),
        gpus=gpus,
        explained=explained_gpu(job, gpus),
    )
    decisions, own_decisions = _decisions_on_gpu(wait)
    before, during = _dispatches_holding(wait, decisions)
    holds = _holds(wait, dispatch_attempts(before + during, now))
    holds += _own_earlier_attempts(wait)
    # Sharing out gives each hold its `seconds`, which its part then tells.
    pieces, drains = _drains(wait, holds, during, own_decisions)
    part_of: dict[Owner, int] = {}
    parts = _hold_parts(wait, holds, viewer, durations, part_of)
    for drain in drains:
        part_of[id(drain)] = len(parts)
        parts.append(drain_part(drain, job, viewer))
    gaps, gap_parts = _parts_nothing_held(wait, holds)
    for part in gap_parts:
        part_of[part["kind"]] = len(parts)
        parts.append(part)
    cut = cut_wait(
        job_id=job.pk, window=wait.window, pieces=pieces + gaps, parts=parts, part_of=part_of
    )
    own_start = _own_start(job, durations)
    other_gpus = (
        other_gpus_during(job, gpus, wait.explained, wait.window, now) if len(gpus) > 1 else []
    )
    return {
        **_answer(wait, cut, own_start, other_gpus),
        "expected": expected_entry(job, durations),
    }


# Ends of a job that never started: its wait stopped there.
_ENDED_QUEUED = (JobStatus.CANCELLED, JobStatus.EXPIRED)


def _wait_end(job: Job, now: datetime) -> datetime:
    """A wait ends at the start; a job cancelled while queued, or expired
    (its wait bound passed), stopped waiting then; one still queued waits
    until now."""
    return job.started_at or (job.finished_at if job.status in _ENDED_QUEUED else None) or now


def _decisions_on_gpu(
    wait: _Wait,
) -> tuple[QuerySet[DispatchDecision], QuerySet[DispatchDecision]]:
    """The other jobs' dispatches and the job's own (both unread), on the
    explained GPU only when there are several: the others ran elsewhere."""
    job = wait.job
    decisions = (
        DispatchDecision.objects.select_related("job__member")
        .exclude(job=job)
        .only(*READ_DECISION_FIELDS, "job__member__name")
    )
    own_decisions = job.decisions.select_related("job")
    if len(wait.gpus) > 1 and wait.explained is not None:
        decisions = decisions.filter(gpu=wait.explained)
        own_decisions = own_decisions.filter(gpu=wait.explained)
    return decisions, own_decisions


def _dispatches_holding(
    wait: _Wait, decisions: QuerySet[DispatchDecision]
) -> tuple[list[DispatchDecision], list[DispatchDecision]]:
    """The dispatches that held the GPU when this job arrived (the last one,
    and with parallel slots every job still running then), in order, and
    those taken while it waited."""
    submitted_at = wait.job.submitted_at
    earlier = decisions.filter(at__lte=submitted_at)
    last = earlier.order_by("-at", "-id").first()
    before = {last} if last else set()
    if last is not None:
        before.update(
            earlier.filter(at=F("job__started_at")).filter(
                Q(job__status=JobStatus.RUNNING) | Q(job__finished_at__gt=submitted_at)
            )
        )
    during = list(decisions.filter(at__gt=submitted_at, at__lt=wait.end).order_by("at", "id"))
    return sorted(before, key=lambda d: (d.at, d.pk)), during


def _holds(wait: _Wait, attempts: list[Attempt]) -> list[Hold]:
    """Each attempt's stretch inside the wait, by what held the GPU: a job
    running when this one arrived, one dispatched ahead, or, for an attempt
    undone, llama-swap or the dispatcher away."""
    # The next dispatch after an undone one: the GPU stayed idle until then
    # because llama-swap or the dispatcher was away.
    next_start = {
        attempt.decision.pk: later.decision.at
        for attempt, later in zip(attempts, attempts[1:], strict=False)
    }
    holds: list[Hold] = []
    for attempt in attempts:
        decision = attempt.decision
        arrived_first = decision.at <= wait.job.submitted_at
        if arrived_first and attempt.span.end <= wait.job.submitted_at:
            continue
        if attempt.ended_by in UNDONE:
            span = clip(Span(decision.at, next_start.get(decision.pk, wait.end)), wait.window)
            kind = (
                PartKind.DISPATCHER_UNAVAILABLE
                if attempt.ended_by == JobEvent.Kind.REQUEUED
                else PartKind.UPSTREAM_UNAVAILABLE
            )
        else:
            span = clip(attempt.span, wait.window)
            kind = PartKind.RUNNING_WHEN_SUBMITTED if arrived_first else PartKind.DISPATCHED_AHEAD
        if span:
            holds.append(Hold(attempt, span, kind))
    return holds


def _own_earlier_attempts(wait: _Wait) -> list[Hold]:
    """The job's own dispatches before its start, on any GPU: it ran (or was
    being sent) then went back to the queue. Their time is told as its own
    on the explained GPU's timeline: while it ran, nothing held it."""
    job = wait.job
    earlier = [
        decision
        for decision in job.decisions.select_related("job__member__tier", "gpu").order_by(
            "at", "id"
        )
        if decision.at != job.started_at
    ]
    holds = []
    for attempt in dispatch_attempts(earlier, wait.now):
        span = clip(attempt.span, wait.window)
        if span:
            holds.append(Hold(attempt, span, PartKind.OWN_EARLIER_ATTEMPT))
    return holds


def _drains(
    wait: _Wait,
    holds: list[Hold],
    during: list[DispatchDecision],
    own_decisions: QuerySet[DispatchDecision],
) -> tuple[list[Piece], list[Drain]]:
    """Each instant once: the job's own earlier attempt's, else shared by
    the jobs running through it, or its drain's. A drain is told by the
    start that followed it, the job's own included, and by the models'
    parallel slots."""
    job = wait.job
    models = {job.model} | {hold.attempt.decision.job.model for hold in holds}
    parallel = dict(ModelSetting.objects.filter(name__in=models).values_list("name", "parallel"))
    next_starts = sorted(
        [*during, *own_decisions.filter(at__gte=job.submitted_at)], key=lambda d: (d.at, d.pk)
    )
    return share_out(holds, next_starts, job, parallel)


def _hold_parts(
    wait: _Wait,
    holds: list[Hold],
    viewer: Member,
    durations: Durations,
    part_of: dict[Owner, int],
) -> list[dict[str, Any]]:
    """The holds' parts, each with the terms that put it ahead: those read
    against the member's own line's starts in the day before the wait.
    `part_of` gets each hold's part."""
    job = wait.job
    lane_starts = list(
        DispatchDecision.objects.filter(
            job__member_id=job.member_id,
            band=job.priority,
            at__gte=job.submitted_at - timedelta(days=1),
            at__lt=wait.end,
        )
        .exclude(job=job)
        .values_list("at", flat=True)
    )
    parts: list[dict[str, Any]] = []
    for hold in holds:
        if hold.kind == PartKind.OWN_EARLIER_ATTEMPT:
            part: dict[str, Any] | None = own_attempt_part(hold, viewer, job)
        else:
            part = hold_part(hold, job, viewer, lane_starts, durations)
        if part is None:
            continue
        if hold.attempt.ended_by == UNRECORDED:
            part["end_recorded"] = False  # counted to its next dispatch, or its finish
        if hold.shared:
            # Its own run inside the wait, of which `seconds` is its share.
            part["wall_seconds"] = round(hold.span.seconds, 3)
            part["shared_with"] = hold.beside
        part_of[id(hold)] = len(parts)
        parts.append(part)
    return parts


def _parts_nothing_held(wait: _Wait, holds: list[Hold]) -> tuple[list[Piece], list[dict[str, Any]]]:
    """The wait no dispatch on the GPU covers, as pieces and parts: the
    member's own running limit where it held the job back, and the GPU idle
    for the rest.

    Requests that did not come through gpusched (foreign load) leave no
    history: such time is told as the GPU idle, and a job still waiting is
    told the foreign requests its GPUs serve now (`foreign_load`)."""
    idle = uncovered(wait.window, [hold.span for hold in holds])
    limited = limit_during(wait.job, idle, wait.now, wait.explained)
    pieces = [Piece(span, [], gap=PartKind.RUNNING_LIMIT) for span in limited.held]
    pieces += [Piece(span, [], gap=PartKind.GPU_IDLE) for span in limited.rest]
    parts: list[dict[str, Any]] = []
    if limited.held:
        parts.append(_running_limit_part(wait.job, limited, wait.explained))
    if limited.rest:
        parts.append(
            {
                "kind": PartKind.GPU_IDLE,
                "seconds": round(sum(span.seconds for span in limited.rest), 3),
                "intervals": _intervals(limited.rest),
                "reason": "no job running: between two jobs, dispatch paused, llama-swap "
                "unreachable, or busy with requests that did not come through gpusched",
            }
        )
    return pieces, parts


def _running_limit_part(job: Job, limited: LimitHeld, gpu: Gpu | None) -> dict[str, Any]:
    limit = job.member.tier.max_running_jobs
    where = gpu.name if gpu is not None else "the GPU"
    return {
        "kind": PartKind.RUNNING_LIMIT,
        "seconds": round(sum(span.seconds for span in limited.held), 3),
        "intervals": _intervals(limited.held),
        "held_by": limited.holders,
        "reason": f"{where} was free but {limited.words}: tier {job.member.tier.name} runs "
        f"{limit} of a member's jobs at once and does not lend a GPU past it",
    }


def _intervals(spans: list[Span]) -> list[dict[str, str]]:
    return [{"from": s.start.isoformat(), "to": s.end.isoformat()} for s in spans]


def _own_start(job: Job, durations: Durations) -> _OwnStart:
    own_decision = job.decisions.order_by("-id").first()
    swap_seconds = None
    if own_decision is not None and own_decision.swap_needed:
        swap_seconds = round(durations.swap_seconds(job.model), 3)
    # Its own start: the slot it took and the jobs on the GPU with it.
    started = own_decision if own_decision and own_decision.at == job.started_at else None
    swap = swap_from_json(own_decision.swap) if own_decision is not None else None
    return _OwnStart(swap_seconds=swap_seconds, started=started, swap=swap)


def _answer(
    wait: _Wait,
    cut: Cut,
    own_start: _OwnStart,
    other_gpus: list[dict[str, Any]],
) -> dict[str, Any]:
    job, explained, started = wait.job, wait.explained, own_start.started
    foreign = _foreign_load(wait)
    cuts = _cuts_by_unload(job)
    summary = wait_summary(
        job,
        cut.shown_wait_seconds,
        cut.parts,
        own_start.swap_seconds,
        explained,
        other_gpus,
        started,
        _parallel_of(job.model) if started is not None and started.in_flight > 1 else None,
    )
    if not cut.adds_up:
        summary += " These parts do not add up to the wait: a defect, logged for the operator."
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
        "wait_deadline": job.wait_deadline.isoformat() if job.wait_deadline else None,
        "as_of": wait.now.isoformat(),
        "measured_wait_seconds": cut.measured_seconds,
        "shown_wait_seconds": cut.shown_wait_seconds,
        "parts": cut.parts,
        "parts_total_seconds": round(
            sum(p["seconds"] + p.get("swap_seconds", 0.0) for p in cut.parts), 3
        ),
        "adds_up": cut.adds_up,
        "pieces": cut.pieces,
        "own_swap_seconds": own_start.swap_seconds,
        "slot": started.gpu_slot if started else None,
        "in_flight": started.in_flight if started else None,
        "borrowed": bool(started and started.borrowed),
        "swap": own_start.swap.as_json() if own_start.swap else None,
        "foreign_load": foreign,
        "cut_by_unload": cuts,
        "summary": " ".join(
            [
                summary,
                *_swap_words(own_start.swap),
                *(entry["text"] for entry in foreign),
                *(entry["text"] for entry in cuts),
            ]
        ),
    }


def _swap_words(swap: Swap | None) -> list[str]:
    """Its start's unloads, as the summary says them ("loading image-xl
    unloads tts-kokoro"); nothing when it unloaded nothing."""
    if swap is None or not swap.unloads:
        return []
    sentence = swap.sentence()
    return [f"At its start, {sentence} (llama-swap's routing)."]


def _cuts_by_unload(job: Job) -> list[dict[str, Any]]:
    """The runs of this job that llama-swap cut by unloading its model: each
    sent it back to the queue (queueapp/dispatch/forwarding.py), not failed."""
    events = JobEvent.objects.filter(
        job=job, kind=JobEvent.Kind.RETURNED_TO_QUEUE, detail__cut_by_unload=True
    ).order_by("at", "id")
    return [
        {
            "at": event.at.isoformat(),
            "text": f"At {event.at:%H:%M:%S} llama-swap unloaded {job.model} while this job "
            "ran (an Unload, its ttl or a crash): the job went back to the queue, "
            "not failed, to run again.",
        }
        for event in events
    ]


def _foreign_load(wait: _Wait) -> list[dict[str, Any]]:
    """For a job still waiting: the GPUs that could run it whose llama-swap is
    also serving requests that did not come through gpusched, as its events
    say now (queueapp/upstream/llama_swap_state.py)."""
    if wait.job.status != JobStatus.QUEUED:
        return []
    alone = gpus_alone(sum(gpu.enabled for gpu in wait.gpus))
    return [
        {
            "gpu": gpu.name,
            "requests": gpu.foreign_in_flight,
            "text": f"{gpu.name} is also serving {gpu.foreign_in_flight} "
            f"request{'' if gpu.foreign_in_flight == 1 else 's'} "
            "that did not come through gpusched.",
        }
        for gpu in wait.gpus
        if gpu.foreign_in_flight and gpu.enabled and _may_run(gpu, wait.job.model, alone=alone)
    ]


def _may_run(gpu: Gpu, model: str, *, alone: bool) -> bool:
    models = gpu.runs_models(alone=alone)
    return models is None or model in models


def _parallel_of(model: str) -> Parallel | None:
    """The model's slots now and where they come from; None without a row."""
    row = ModelSetting.objects.filter(name=model).values_list("parallel", "parallel_source").first()
    return Parallel(row[0], ParallelSource(row[1])) if row else None
