"""The answer told in one sentence (in the shown tenths of queueapp/why/cut.py,
so its figures are the table's): the wait's parts grouped (jobs already
running, jobs ahead by the term that put them there, swaps, drains, its own
earlier attempts, time away, the running limit, idle), the other GPUs and
the job's own swap."""

from __future__ import annotations

from typing import Any

from queueapp.models import DispatchDecision, Gpu, Job, JobStatus
from queueapp.policy.server_slots import Parallel, ParallelSource
from queueapp.why.kinds import TERM_WORDS, PartKind


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


def wait_summary(
    job: Job,
    wait: float,
    parts: list[dict[str, Any]],
    own_swap: float | None,
    explained: Gpu | None,
    other_gpus: list[dict[str, Any]],
    started: DispatchDecision | None,
    parallel: Parallel | None = None,
) -> str:
    """`parallel`: the job's model's slots now, and where they come from."""
    verb = "Waiting for" if job.status == JobStatus.QUEUED else "Waited"
    ahead = [p for p in parts if p["kind"] == PartKind.DISPATCHED_AHEAD]
    pieces = [*_running_pieces(parts), *_ahead_pieces(ahead, job)]
    pieces += [
        _drain_words(part, job, ahead={p["job"]["id"] for p in ahead})
        for part in parts
        if part["kind"] == PartKind.DRAIN
    ]
    pieces += [
        f"{duration_words(part['shown_seconds'])} in your own earlier attempt on {part['gpu']}"
        for part in parts
        if part["kind"] == PartKind.OWN_EARLIER_ATTEMPT
    ]
    pieces += _unused_time_pieces(parts)
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
            f"{job.model} job{'s' if others != 1 else ''} on the GPU"
            + (f" ({_slots_words(job.model, parallel)})" if parallel is not None else "")
            + "."
        )
    if other_gpus:
        sentence += " " + "; ".join(f"{o['gpu']} {o['reason']}" for o in other_gpus) + "."
    if started is not None and started.borrowed:
        limit = job.member.tier.max_running_jobs
        where = f" on {explained.name}" if explained is not None else ""
        sentence += (
            f" It ran{where} beyond your running limit ({limit}): no other job could use it."
        )
    if own_swap:
        sentence += f" Its own start then loaded {job.model} (about {duration_words(own_swap)})."
    if job.status == JobStatus.EXPIRED:
        # The error names what held the GPUs when its bound passed.
        sentence += f" It expired, never sent to llama-swap: {job.error}."
    return sentence


_SOURCE_WORDS = {
    ParallelSource.OPERATOR: "as the operator set",
    ParallelSource.SERVER: "as its server reports",
    ParallelSource.CONFIG: "as its llama-swap command line sets",
    ParallelSource.DEFAULT: "by default",
}


def _slots_words(model: str, parallel: Parallel) -> str:
    """ "chat runs 4 at once, as its server reports"."""
    return f"{model} runs {parallel.value} at once, {_SOURCE_WORDS[parallel.source]}"


def _running_pieces(parts: list[dict[str, Any]]) -> list[str]:
    """The jobs already running when the job arrived: one named, several
    counted."""
    running = [p for p in parts if p["kind"] == PartKind.RUNNING_WHEN_SUBMITTED]
    if len(running) == 1:
        (part,) = running
        band = _band_words(part["job"]["band"])
        return [
            f"{duration_words(part['shown_seconds'])} for a band {band} "
            f"{part['job']['model']} job already running (jobs are never interrupted)"
        ]
    if running:
        seconds = sum(p["shown_seconds"] for p in running)
        return [
            f"{duration_words(seconds)} for {len(running)} jobs already running "
            "(jobs are never interrupted)"
        ]
    return []


def _ahead_pieces(ahead: list[dict[str, Any]], job: Job) -> list[str]:
    """The jobs dispatched ahead, grouped by the term that put them there,
    then the part of that time spent loading their models."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for part in ahead:
        if "wall_seconds" in part and part["seconds"] + part["swap_seconds"] <= 0:
            continue  # all its time was a drain, told below
        groups.setdefault(part["deciding_term"], []).append(part)
    pieces: list[str] = []
    for term, group in groups.items():
        seconds = sum(p["shown_seconds"] for p in group)
        count = f"{len(group)} job{'s' if len(group) > 1 else ''}"
        if term == "band":
            bands = sorted({p["job"]["band"] for p in group}, reverse=True)
            higher = ", ".join(_band_words(b) for b in bands)
            detail = f"band {higher} vs your {_band_words(job.priority)}"
        elif term == "your other line":
            models = ", ".join(sorted({p["job"]["model"] for p in group}))
            turn = "its turn" if len(group) == 1 else "their turns"
            detail = f"your own {models} job{'s' if len(group) > 1 else ''} took {turn}"
        else:
            detail = TERM_WORDS.get(term, term)
        pieces.append(f"{duration_words(seconds)} behind {count} ({detail})")
    swaps = sum(p["swap_seconds"] for p in ahead)
    if swaps > 0:
        pieces.append(f"of which about {duration_words(swaps)} loading other models")
    return pieces


def _unused_time_pieces(parts: list[dict[str, Any]]) -> list[str]:
    """The time the GPU ran no job ahead of this one: llama-swap or the
    dispatcher away, the member's own running limit, the GPU idle. Less than
    a second of each is not worth a clause."""
    pieces: list[str] = []
    away = {
        PartKind.UPSTREAM_UNAVAILABLE: "with llama-swap unavailable",
        PartKind.DISPATCHER_UNAVAILABLE: "with the dispatcher stopped",
    }
    for kind, words in away.items():
        seconds = sum(p["shown_seconds"] for p in parts if p["kind"] == kind)
        if seconds >= 1:
            pieces.append(f"{duration_words(seconds)} {words}")
    held = next((p for p in parts if p["kind"] == PartKind.RUNNING_LIMIT), None)
    if held and held["seconds"] >= 1:
        pieces.append(f"{duration_words(held['shown_seconds'])} while your own job ran elsewhere")
    idle = next((p for p in parts if p["kind"] == PartKind.GPU_IDLE), None)
    if idle and idle["seconds"] >= 1:
        pieces.append(f"{duration_words(idle['shown_seconds'])} with the GPU idle")
    return pieces


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
    return f"{duration_words(part['shown_seconds'])} {words}"
