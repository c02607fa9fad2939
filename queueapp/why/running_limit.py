"""The member's own running limit: the idle stretches of the wait when the
member already held as many GPUs as their tier allows, told apart from the
GPU standing idle for no one."""

from __future__ import annotations

from datetime import datetime

from queueapp.models import Job
from queueapp.why.spans import Span, clip, uncovered


def limit_held_by(
    job: Job, spans: list[Span], now: datetime
) -> tuple[list[dict[str, object]], str]:
    """The member's own jobs that held its running limit during `spans` (id
    and GPU), and the words: "your running limit (1) was held by job 7 on gpu0"."""
    holders = _limit_holders(job, spans, now)
    named = ", ".join(f"job {h['id']} on {h['gpu'] or 'a GPU'}" for h in holders)
    limit = job.member.tier.max_running_jobs
    return holders, f"your running limit ({limit}) was held by {named or 'your own jobs'}"


def _limit_holders(job: Job, spans: list[Span], now: datetime) -> list[dict[str, object]]:
    """The member's own jobs that ran during `spans`, first started first."""
    if not spans:
        return []
    held = []
    others = (
        Job.objects.filter(member_id=job.member_id, started_at__lt=spans[-1].end)
        .exclude(pk=job.pk)
        .exclude(finished_at__lte=spans[0].start)
        .order_by("started_at", "id")
        .values_list("pk", "gpu__name", "started_at", "finished_at")
    )
    for pk, gpu, start, end in others:
        if start is None:
            continue
        ran = Span(start, end or now)
        if any(clip(ran, span) for span in spans):
            held.append({"id": pk, "gpu": gpu})
    return held


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
