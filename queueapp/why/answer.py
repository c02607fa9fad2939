"""The answer to 'why did my job wait?': the explained GPU's dispatches
during the wait turned into holds, the GPU's time shared out, each hold's and
drain's part, the running limit and idle time, and the summary."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db.models import F, Q

from queueapp.eta import Durations
from queueapp.models import DispatchDecision, Job, JobEvent, JobStatus, Member, ModelSetting
from queueapp.selectors import db_now, gpus_list
from queueapp.why.attempts import UNDONE, dispatch_attempts
from queueapp.why.kinds import PartKind
from queueapp.why.other_gpus import explained_gpu, other_gpus_during
from queueapp.why.parts import drain_part, hold_part
from queueapp.why.running_limit import held_by_running_limit
from queueapp.why.shared_time import Hold, share_out
from queueapp.why.spans import Span, clip, uncovered
from queueapp.why.summary import wait_summary


def job_why(*, job: Job, viewer: Member) -> dict[str, Any]:
    now = db_now()
    end = job.started_at or (job.finished_at if job.status == JobStatus.CANCELLED else None) or now
    window = Span(job.submitted_at, end)
    durations = Durations.load()
    parts: list[dict[str, Any]] = []
    gpus = gpus_list()
    explained = explained_gpu(job, gpus)

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
    attempts = dispatch_attempts(sorted(before, key=lambda d: (d.at, d.pk)) + during, now)
    # The next dispatch after an undone one: the GPU stayed idle until then
    # because llama-swap or the dispatcher was away.
    next_start = {
        attempt.decision.pk: later.decision.at
        for attempt, later in zip(attempts, attempts[1:], strict=False)
    }

    holds: list[Hold] = []
    for attempt in attempts:
        decision = attempt.decision
        arrived_first = decision.at <= job.submitted_at
        if arrived_first and attempt.span.end <= job.submitted_at:
            continue
        if attempt.ended_by in UNDONE:
            span = clip(Span(decision.at, next_start.get(decision.pk, end)), window)
            kind = (
                PartKind.DISPATCHER_UNAVAILABLE
                if attempt.ended_by == JobEvent.Kind.REQUEUED
                else PartKind.UPSTREAM_UNAVAILABLE
            )
        else:
            span = clip(attempt.span, window)
            kind = PartKind.RUNNING_WHEN_SUBMITTED if arrived_first else PartKind.DISPATCHED_AHEAD
        if span:
            holds.append(Hold(attempt, span, kind))

    # Each instant once: shared by the jobs running through it, or its drain's.
    models = {job.model} | {hold.attempt.decision.job.model for hold in holds}
    parallel = dict(ModelSetting.objects.filter(name__in=models).values_list("name", "parallel"))
    next_starts = sorted(
        [*during, *own_decisions.filter(at__gte=job.submitted_at)], key=lambda d: (d.at, d.pk)
    )
    drains = share_out(holds, next_starts, job, parallel)

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
        part = hold_part(hold, job, viewer, lane_starts, durations)
        if part is None:
            continue
        if hold.shared:
            # Its own run inside the wait, of which `seconds` is its share.
            part["wall_seconds"] = round(hold.span.seconds, 3)
            part["shared_with"] = hold.beside
        parts.append(part)
    parts += [drain_part(drain, job, viewer) for drain in drains]

    idle = uncovered(window, [hold.span for hold in holds])
    held, idle = held_by_running_limit(job, idle, now)
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
    other_gpus = other_gpus_during(job, gpus, explained, window, now) if len(gpus) > 1 else []
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
        "summary": wait_summary(job, wait, parts, own_swap, explained, other_gpus, started),
    }
