"""The GPUs of the answer: the one whose timeline tells the wait, and what
each other GPU was doing meanwhile (not serving the model, disabled, down, or
busy with other jobs, how many and how long)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from queueapp.eta import queue_forecast
from queueapp.models import DispatchDecision, Gpu, Job, JobStatus
from queueapp.policy.facts import gpus_alone
from queueapp.why.attempts import decisions_in, dispatch_attempts
from queueapp.why.running_limit import limit_during
from queueapp.why.spans import Span, clip, cut_into_pieces, uncovered
from queueapp.why.summary import duration_words


def explained_gpu(job: Job, gpus: list[Gpu]) -> Gpu | None:
    """The GPU whose timeline tells the wait: the one the job ran on (its
    last decision's), else the one the forecast expects, else the first
    that runs its model. None without GPUs, or when no GPU runs it."""
    if not gpus:
        return None
    decided = job.decisions.order_by("-id").values_list("gpu_id", flat=True).first()
    by_id = {gpu.pk: gpu for gpu in gpus}
    if decided in by_id:
        return by_id[decided]
    alone = gpus_alone(sum(1 for gpu in gpus if gpu.enabled))
    running = [gpu for gpu in gpus if _runs(gpu, job.model, alone=alone)]
    if job.status == JobStatus.QUEUED and len(running) > 1:
        place = queue_forecast(include=[job]).for_job(job.pk)
        expected = next((gpu for gpu in running if place and gpu.name == place.gpu), None)
        if expected is not None:
            return expected
    return running[0] if running else None


def _runs(gpu: Gpu, model: str, *, alone: bool) -> bool:
    models = gpu.runs_models(alone=alone)
    return models is None or model in models


def other_gpus_during(
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
                for attempt in dispatch_attempts(
                    list(
                        decisions_in(
                            DispatchDecision.objects.select_related("job").filter(gpu=gpu),
                            window,
                        )
                        .exclude(job=job)
                        .order_by("at", "id")
                    ),
                    now,
                )
                if (span := clip(attempt.span, window))
            ]
            # Jobs that ran at once count once.
            pieces = [piece for piece, _ in cut_into_pieces(ran)]
            busy = sum(piece.seconds for piece in pieces)
            entry.update(
                state="busy",
                jobs=len(ran),
                busy_seconds=round(busy, 3),
                reason=f"ran {len(ran)} other job{'s' if len(ran) != 1 else ''} "
                f"({duration_words(busy)}) while yours waited",
            )
            held = _free_but_held(job, gpu, uncovered(window, pieces), now)
            if held:
                entry.update(held, reason=f"{entry['reason']}; {held['reason']}")
        others.append(entry)
    return others


def _free_but_held(job: Job, gpu: Gpu, idle: list[Span], now: datetime) -> dict[str, Any]:
    """When the GPU stood free while the member's own jobs held its tier's
    running limit (a strict tier: no borrowing), what the reason adds."""
    limited = limit_during(job, idle, now, gpu)
    seconds = sum(span.seconds for span in limited.held)
    if seconds < 1:
        return {}
    return {
        "free_but_held_seconds": round(seconds, 3),
        "held_by": limited.holders,
        "reason": f"it was free for {duration_words(seconds)} but {limited.words}",
    }
