"""The GPU's time during the wait shared out: each piece between starts and
ends goes whole to the job's own earlier attempt when one ran through it,
else whole to the drain it is part of (jobs of one parallel model in flight
while the GPU waits to swap), else is shared equally by the attempts running
through it. Each piece is kept with what it went to (queueapp/why/cut.py
turns them into the parts' seconds)."""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

from queueapp.models import DispatchDecision, Job
from queueapp.why.attempts import Attempt
from queueapp.why.kinds import PartKind
from queueapp.why.spans import Span, cut_into_pieces


@dataclass
class Hold:
    """One attempt holding the GPU during the wait, and its share of it."""

    attempt: Attempt
    span: Span  # inside the wait
    kind: PartKind
    seconds: float = 0.0  # its share of each instant of `span`, drains left out
    shared: bool = False  # some of `span` was shared with other jobs or a drain
    beside: int = 0  # the most other jobs that ran beside it


@dataclass
class Piece:
    """One stretch of the wait and what it went to: the holds sharing it
    equally, a drain, or (gaps no dispatch covers) the kind of the gap."""

    span: Span
    holds: list[Hold]
    drain: Drain | None = None
    gap: PartKind | None = None


@dataclass
class Drain:
    """A stretch of the wait when jobs of `model` were in flight and the GPU
    took no new one of them: it waited for them all to end before swapping
    to `swap_to`'s model (None: no swap yet, this job still waits)."""

    model: str
    swap_to: Job | None
    spans: list[Span]
    in_flight: int
    jobs: list[Job]


def _draining(
    holds: list[Hold],
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


def share_out(
    holds: list[Hold],
    next_starts: list[DispatchDecision],
    job: Job,
    parallel: dict[str, int],
) -> tuple[list[Piece], list[Drain]]:
    """Each instant of the holds' spans counted once: given whole to the
    job's own earlier attempt running through it, else to the drain it is
    part of, else shared equally by the holds running through it (their
    `seconds`). The pieces in order, and the drains."""
    drains: dict[int | None, Drain] = {}
    pieces: list[Piece] = []
    for span, running in cut_into_pieces([hold.span for hold in holds]):
        sharing = [holds[index] for index in running]
        own = [hold for hold in sharing if hold.kind == PartKind.OWN_EARLIER_ATTEMPT]
        if own:
            # The job itself ran then: nothing else held it back.
            own[0].seconds += span.seconds
            pieces.append(Piece(span, own[:1]))
            continue
        draining = _draining(sharing, span, next_starts, job, parallel)
        if draining is not None:
            model, swap = draining
            drain = drains.setdefault(
                swap.pk if swap else None, Drain(model, swap.job if swap else None, [], 0, [])
            )
            if drain.spans and drain.spans[-1].end == span.start:
                drain.spans[-1] = Span(drain.spans[-1].start, span.end)
            else:
                drain.spans.append(span)
            drain.in_flight = max(drain.in_flight, len(sharing))
            drain.jobs += [
                h.attempt.decision.job for h in sharing if h.attempt.decision.job not in drain.jobs
            ]
            pieces.append(Piece(span, [], drain=drain))
        else:
            pieces.append(Piece(span, sharing))
        for hold in sharing:
            if draining is None:
                hold.seconds += span.seconds / len(sharing)
            if draining is not None or len(sharing) > 1:
                hold.shared = True
                hold.beside = max(hold.beside, len(sharing) - 1)
    return pieces, list(drains.values())
