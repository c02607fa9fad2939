"""The member's own running limit: the idle stretches of the wait when the
member already held as many GPUs as their tier allows, told apart from the
GPU standing idle for no one.

`limit_during` reads it from the reasons the claim kept
(policy/skip_record.py): each start's decision keeps why the GPU stood
idle before it (`idle_reason`), and the GPU's `GpuIdle` record says why it
stands idle now; a stretch counts where they name the member as held at its
limit. What they do not cover (decisions recorded before reasons were
kept; an idle stretch no start ended, whose record a later pass rewrote)
is told from the member's job history as before (`held_by_running_limit`,
`limit_held_by`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import BooleanField, ExpressionWrapper, Q

from queueapp.models import DispatchDecision, Gpu, GpuIdle, Job
from queueapp.policy.skip_record import StoredSkips
from queueapp.why.spans import Span, clip, uncovered


@dataclass(frozen=True)
class LimitHeld:
    """The stretches of `idle` when the member's running limit held the job
    back (`held`), the rest, the member's jobs that held it, and the words."""

    held: list[Span]
    rest: list[Span]
    holders: list[dict[str, object]] = field(default_factory=list)
    words: str = ""


def limit_during(job: Job, idle: list[Span], now: datetime, gpu: Gpu | None) -> LimitHeld:
    """The running limit's part of `idle` on `gpu`: from the kept reasons
    over the stretches they cover, from the member's job history over the
    rest (a GPU keeps only its latest idle record: an idle stretch that no
    start ended and a later pass rewrote is told from history).

    A stretch counts only while another of the member's jobs ran (never the
    job itself: its own earlier attempt is a part of its own), and the jobs
    named are those that ran in it. A kept record stands for its whole idle
    stretch, so on its own it could name a job that ended midway."""
    stored = _kept_reasons(gpu, idle, now) if gpu is not None and idle else None
    if stored is None:
        return _from_history(job, idle, now)
    limit = job.member.tier.max_running_jobs
    named = {
        holder["id"]
        for _, skips in stored
        if skips.capped(job.member_id)
        for holder in skips.holders(job.member_id)
    }
    runs = _runs_of(named - {job.pk}, now)
    held: list[Span] = []
    holders: list[dict[str, object]] = []
    for span, skips in stored:
        if not skips.capped(job.member_id):
            continue
        limit = skips.limit(job.member_id) or limit
        for holder in skips.holders(job.member_id):
            if holder["id"] == job.pk:
                continue  # its own earlier attempt: a part of its own
            # A holder no longer stored (pruned) is taken at its record's word.
            run = runs.get(holder["id"], span)
            ran = clip(span, run) if run is not None else None
            pieces = [part for each in idle if ran and (part := clip(ran, each))]
            if pieces:
                held += pieces
                holders += [holder] if holder not in holders else []
    covered = _merged([span for span, _ in stored])
    untold = [gap for span in idle for gap in uncovered(span, covered)]
    earlier = _from_history(job, untold, now)
    held = _merged(held + earlier.held)
    holders += [h for h in earlier.holders if h not in holders]
    rest = [gap for span in idle for gap in uncovered(span, held)]
    return LimitHeld(held, rest, holders, _held_words(limit, holders))


def _runs_of(job_ids: set[int], now: datetime) -> dict[int, Span | None]:
    """Each stored job's run (until now while it runs; None: it has not
    started, or went back to the queue); a job no longer stored is absent."""
    rows = Job.objects.filter(pk__in=job_ids).values_list("pk", "started_at", "finished_at")
    return {pk: Span(start, end or now) if start is not None else None for pk, start, end in rows}


def _held_words(limit: int, holders: list[dict[str, object]]) -> str:
    named = ", ".join(f"job {h['id']} on {h['gpu'] or 'a GPU'}" for h in holders)
    return f"your running limit ({limit}) was held by {named or 'your own jobs'}"


def _from_history(job: Job, idle: list[Span], now: datetime) -> LimitHeld:
    held, rest = held_by_running_limit(job, idle, now)
    if not held:
        return LimitHeld(held, rest)
    return LimitHeld(held, rest, *limit_held_by(job, held, now))


def _kept_reasons(
    gpu: Gpu, idle: list[Span], now: datetime
) -> list[tuple[Span, StoredSkips]] | None:
    """The idle stretches of `gpu` that reach into `idle`'s extent, each
    with the reasons kept for it; None when the GPU kept none over that time
    (its decisions predate the kept reasons).

    An idle stretch is kept on the start that ended it: those inside the
    extent, and the first after it (a stretch it ends may begin inside).
    Only whether a start kept its skips is read of them, not the records."""
    start, end = idle[0].start, idle[-1].end
    inside = list(
        DispatchDecision.objects.filter(gpu=gpu, at__gte=start, at__lte=end)
        .annotate(unkept=ExpressionWrapper(Q(skips__isnull=True), output_field=BooleanField()))
        .order_by("at", "id")
        .values_list("at", "unkept", "idle_reason")
    )
    if any(unkept for _, unkept, _ in inside):
        return None  # recorded before the reasons were kept
    ended = [(at, reason) for at, _, reason in inside]
    after = (
        DispatchDecision.objects.filter(gpu=gpu, at__gt=end)
        .order_by("at", "id")
        .values_list("at", "idle_reason")
        .first()
    )
    if after is not None:
        ended.append(after)
    stretches = [
        (Span(_moment(reason["since"]), at), StoredSkips(reason["skips"]))
        for at, reason in ended
        if reason is not None
    ]
    current = GpuIdle.objects.filter(gpu=gpu, since__lt=end).first()
    if current is not None:
        stretches.append((Span(current.since, now), StoredSkips(current.skips)))
    if not stretches and not inside:
        return None
    return stretches


def _moment(value: Any) -> datetime:
    """A timestamp as PostgreSQL writes it into JSON."""
    return datetime.fromisoformat(value)


def _merged(spans: list[Span]) -> list[Span]:
    merged: list[Span] = []
    for span in sorted(spans, key=lambda s: s.start):
        if merged and span.start <= merged[-1].end:
            merged[-1] = Span(merged[-1].start, max(merged[-1].end, span.end))
        else:
            merged.append(span)
    return merged


def limit_held_by(
    job: Job, spans: list[Span], now: datetime
) -> tuple[list[dict[str, object]], str]:
    """The member's own jobs that held its running limit during `spans` (id
    and GPU), and the words: "your running limit (1) was held by job 7 on gpu0"."""
    holders = _limit_holders(job, spans, now)
    return holders, _held_words(job.member.tier.max_running_jobs, holders)


def _own_other_runs(
    job: Job, spans: list[Span], now: datetime
) -> list[tuple[dict[str, object], Span]]:
    """The member's other jobs' runs that overlap `spans` (each with its id
    and GPU), first started first; a run still going lasts until now."""
    if not spans:
        return []
    others = (
        Job.objects.filter(member_id=job.member_id, started_at__lt=spans[-1].end)
        .exclude(pk=job.pk)
        .exclude(finished_at__lte=spans[0].start)
        .order_by("started_at", "id")
        .values_list("pk", "gpu__name", "started_at", "finished_at")
    )
    runs = []
    for pk, gpu, start, end in others:
        if start is None:
            continue
        ran = Span(start, end or now)
        if any(clip(ran, span) for span in spans):
            runs.append(({"id": pk, "gpu": gpu}, ran))
    return runs


def _limit_holders(job: Job, spans: list[Span], now: datetime) -> list[dict[str, object]]:
    """The member's own jobs that ran during `spans`, first started first."""
    return [holder for holder, _ in _own_other_runs(job, spans, now)]


def held_by_running_limit(
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
    held = [part for span in idle for cap in capped if (part := clip(cap, span))]
    return held, [rest for span in idle for rest in uncovered(span, held)]


def _overlaps_merged(runs: list[tuple[datetime, datetime]]) -> list[tuple[datetime, datetime]]:
    """`runs` with those that overlap made one (those that only touch stay apart)."""
    merged: list[tuple[datetime, datetime]] = []
    for start, end in sorted(runs):
        if merged and start < merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged
