"""Playing the queue forward: positions and estimated start times.

The same `decide` the claim calls (decide.py) makes each step, on a virtual
clock: aging advances, the resident model changes after each job, a dispatch
restarts the aging of the member's other jobs in that band (the lane clock),
and each queue line (a member's jobs of one band and model) goes in
submission order, exactly as at a real dispatch (queueapp/lanes.py).
Durations come from what finished jobs took (queueapp/eta.py); the results
are estimates.

A model with `parallel` N > 1 shares its GPU: while k < N of its jobs are
in flight there, the GPU offers a slot at once, and `decide` over the jobs
that GPU may run says who takes it. A job of another model never
joins them: when it wins, the GPU takes no one else until its last job in
flight ends, and the pick is made again then (the play has moved on: that
job may have gone elsewhere meanwhile). With every model at 1 a GPU runs one
job at a time and the play is the one it always was.

With resident sets (a GPU's `routing`: resident_sets.py), jobs of models
llama-swap keeps loaded together join each other as `decide` allows, a
drain is decided again as each job ends, and a job is charged only the
load its routing predicts (forecast_timeline.py).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from queueapp.policy.decide import (
    Borrowing,
    Decision,
    Outcome,
    Skip,
    Snapshot,
    decide,
)
from queueapp.policy.facts import lane_eligible_at
from queueapp.policy.forecast_heads import Heads
from queueapp.policy.forecast_timeline import ForecastGpu, Timeline
from queueapp.policy.occupancy import batched_seconds
from queueapp.policy.score import Candidate, PolicySettings


@dataclass(frozen=True)
class Forecast:
    job_id: int
    position: int  # 1 = next to start
    estimated_start: float  # unix seconds
    estimated_seconds: float  # its own run time, swap included
    gpu: str | None = None  # where it would run (several GPUs)
    in_flight: int = 1  # jobs on its GPU as it starts, itself included


def _line_order(candidate: Candidate) -> tuple[float, int]:
    return (candidate.submitted_at, candidate.job_id)


def play_forward(
    candidates: Iterable[Candidate],
    *,
    now: float,
    gpu_free_at: float,
    resident_model: str | None,
    settings: PolicySettings,
    run_seconds: Callable[[Candidate], float],
    swap_seconds: Callable[[str], float],
    stop_after: int | None = None,
    until_job_id: int | None = None,
    more_in_line: Callable[[Candidate], list[Candidate]] | None = None,
    gpus: Sequence[ForecastGpu] | None = None,
    running_limit: Callable[[int], int] | None = None,
    running_until: Mapping[int, Sequence[tuple[float, str]]] | None = None,
    run_seconds_in_flight: Callable[[Candidate, int], float] | None = None,
    borrowing: Borrowing | None = None,
) -> list[Forecast]:
    """Dispatch order and start times if nothing new arrives.

    Each queue line's first candidate is its head and keeps its
    `eligible_at`; the others age from the later of their submission and the
    last dispatch in their lane. `gpu_free_at` is when the running job should
    end (now when idle). The play stops after `stop_after` jobs, once
    `until_job_id` is placed, or when the queue is empty. `more_in_line(last)`
    may return the line's jobs after `last` when the given ones run out.

    `gpus`, when given, replaces `gpu_free_at` and `resident_model`: each
    step is played on the GPU that picks first (the first listed on a tie),
    with its own resident model; a GPU with none of its models left waiting
    drops out. `running_limit(member_id)` is how many GPUs a member's jobs
    may hold at once, and `running_until` when each member's running jobs
    should end and on which GPU (by name): a GPU skips the jobs of a member
    at the limit who does not hold it, and waits for a member's job to end
    when only theirs are left, unless `borrowing` lends it (decide.Borrowing).
    A head past its wait bound is skipped, and expired when nothing else
    may go, as the claim does.

    A GPU whose `parallel` lets a model share it plays its slots (the
    module's docstring says how). `run_seconds(candidate)` is a job's run
    alone; `run_seconds_in_flight(candidate, in_flight)` its run with
    `in_flight` jobs (itself included) on its GPU as it starts, by default
    the alone figure slowed as a batching server is (`batched_seconds`).
    Each step is `decide`, the claim's rules (`_decide_over_heads`).
    """
    given = list(gpus) if gpus is not None else [ForecastGpu("", gpu_free_at, resident_model)]
    play = _Play(
        candidates,
        now=now,
        gpus=given,
        settings=settings,
        running_limit=running_limit,
        running_until=running_until,
        more_in_line=more_in_line,
        borrowing=borrowing,
    )
    order: list[Forecast] = []
    while play.heads and play.playing and (stop_after is None or len(order) < stop_after):
        step = play.next_start()
        if step is None:
            continue
        timeline, chosen, clock = step
        in_flight = len(timeline.ends) + 1
        seconds = _seconds_of(
            chosen,
            in_flight=in_flight,
            swap=timeline.loads(chosen.model, clock),
            run_seconds=run_seconds,
            swap_seconds=swap_seconds,
            run_seconds_in_flight=run_seconds_in_flight,
        )
        name = timeline.gpu.name
        order.append(
            Forecast(chosen.job_id, len(order) + 1, clock, seconds, name or None, in_flight)
        )
        if chosen.job_id == until_job_id:
            break
        play.started(chosen, timeline, clock=clock, seconds=seconds)
    return order


def _seconds_of(
    chosen: Candidate,
    *,
    in_flight: int,
    swap: bool,
    run_seconds: Callable[[Candidate], float],
    swap_seconds: Callable[[str], float],
    run_seconds_in_flight: Callable[[Candidate, int], float] | None,
) -> float:
    """A played job's run: alone with its swap, else beside `in_flight` - 1
    others (no swap: they share the model)."""
    load = swap_seconds(chosen.model) if swap else 0.0
    if in_flight == 1:
        return run_seconds(chosen) + load
    if run_seconds_in_flight is not None:
        return run_seconds_in_flight(chosen, in_flight) + load
    return batched_seconds(run_seconds(chosen), in_flight) + load


class _Play:
    """The state of `play_forward`: the queue lines and their heads, each
    GPU's timeline, and each member's runs (the running ones, then the
    played ones: when each ends, and on which GPU)."""

    def __init__(
        self,
        candidates: Iterable[Candidate],
        *,
        now: float,
        gpus: list[ForecastGpu],
        settings: PolicySettings,
        running_limit: Callable[[int], int] | None,
        running_until: Mapping[int, Sequence[tuple[float, str]]] | None,
        more_in_line: Callable[[Candidate], list[Candidate]] | None,
        borrowing: Borrowing | None = None,
    ) -> None:
        self.now = now
        self.settings = settings
        self.running_limit = running_limit
        self.borrowing = borrowing
        self.more_in_line = more_in_line
        self.lines: dict[tuple[int, int, str], deque[Candidate]] = {}
        for candidate in sorted(candidates, key=_line_order):
            self.lines.setdefault(candidate.line, deque()).append(candidate)
        self.heads = Heads(settings.aging_divisor)
        for queue in self.lines.values():
            self.heads.put(queue.popleft())
        self.timelines = [Timeline(gpu, now=now) for gpu in gpus]
        self.playing = list(self.timelines)
        self.ends: dict[int, list[tuple[float, str]]] = {
            member: list(runs) for member, runs in (running_until or {}).items()
        }
        # Per lane, its last dispatch in the play (a queued job behind its
        # line's head was read aging from the lane's clock before it).
        self.lane_clocks: dict[tuple[int, int], float] = {}

    def next_start(self) -> tuple[Timeline, Candidate, float] | None:
        """`decide` for the GPU that picks next: the job it starts, on which
        timeline, when; None when it waits, drains or drops out instead."""
        timeline = min(self.playing, key=lambda t: t.next_at)
        if timeline.next_at == math.inf:
            self.playing.clear()  # every GPU left waits for a change that cannot come
            return None
        clock = max(self.now, timeline.next_at)
        later = timeline.waits_at(clock)
        if later is not None:
            timeline.next_at = later
            return None
        while due := self.heads.due(clock):
            # Past their wait bound: expired (the dispatchers' sweep does it
            # within a second), and their lines move on.
            self.expire(due, clock=clock)
        snapshot = Snapshot(
            now=clock,
            gpu=timeline.view(clock),
            heads=self.heads.contenders(),
            settings=self.settings,
            others=[other.peer(clock) for other in self.timelines if other is not timeline],
            running_limit=self.running_limit,
            borrowing=self.borrowing,
        )
        decision = _decide_over_heads(snapshot, self.heads, self.ends)
        if decision.outcome is Outcome.NOTHING:
            self._idle(timeline, decision, snapshot, clock=clock)
            return None
        if decision.outcome is Outcome.FULL:
            # Resident sets: every head waits for a slot of its own model.
            timeline.wait_for_change(until=timeline.ends[0])
            return None
        assert decision.chosen is not None  # START or DRAIN: waits_at left a slot
        if decision.outcome is Outcome.DRAIN:
            timeline.drain()
            return None
        return timeline, decision.chosen.candidate, clock

    def started(
        self, chosen: Candidate, timeline: Timeline, *, clock: float, seconds: float
    ) -> None:
        """`chosen` runs from `clock` for `seconds`: its line and lane move on
        as at a real dispatch (queueapp/lanes.py)."""
        heads = self.heads
        heads.remove(chosen)
        self.lane_clocks[chosen.lane] = clock
        for head in heads.in_lane(chosen.lane):
            if head.eligible_at < clock:
                heads.put(replace(head, eligible_at=clock))
        self._promote_after(chosen)
        timeline.start(chosen.model, clock=clock, seconds=seconds)
        self.ends.setdefault(chosen.member_id, []).append((clock + seconds, timeline.gpu.name))
        self._wake(clock)

    def _wake(self, clock: float) -> None:
        for other in self.playing:
            other.wake(clock)

    def _idle(
        self, timeline: Timeline, decision: Decision, snapshot: Snapshot, *, clock: float
    ) -> None:
        """Nothing may start on `timeline` now: it waits for a member's job
        to end (the running limit), or for the queue to change when a head
        is pinned elsewhere (the next in its line may not be); otherwise
        nothing it runs waits any more and it drops out of the play."""
        wait_until = _first_end_of(decision, snapshot, self.ends)
        if wait_until is not None and self.borrowing is not None:
            # The guard refused to lend it: another GPU's next move may
            # change that before the member's job ends.
            wait_until = min(
                [wait_until, *(t.next_at for t in self.timelines if t.next_at > clock)]
            )
        if decision.skipped_for(Skip.PINNED):
            timeline.wait_for_change(until=wait_until)
        elif wait_until is None:
            self.playing.remove(timeline)
        else:
            timeline.next_at = wait_until  # only members at their limit wait for it

    def expire(self, heads: Sequence[Candidate], *, clock: float) -> None:
        """Heads past their wait bound leave their lines, as the claim's
        expiry takes them out; their lanes' clocks stay."""
        for head in heads:
            self.heads.remove(head)
            self._promote_after(head)
        if heads:
            self._wake(clock)

    def _promote_after(self, last: Candidate) -> None:
        """The next job of `last`'s line becomes its head, aging from its
        lane's clock (queueapp/lanes.py), as the play has moved it."""
        waiting = self.lines[last.line]
        if not waiting and self.more_in_line is not None:
            waiting.extend(self.more_in_line(last))
        if waiting:
            following = waiting.popleft()
            # Its lane dispatched during the play: it ages from then; else
            # from the lane's clock it was read with (its `eligible_at`).
            played = self.lane_clocks.get(last.lane)
            eligible = following.eligible_at
            if played is not None:
                eligible = lane_eligible_at(submitted_at=following.submitted_at, lane_clock=played)
            self.heads.put(replace(following, eligible_at=eligible))


def _held_at(
    clock: float, members: set[int], ends: dict[int, list[tuple[float, str]]]
) -> dict[int, frozenset[str]]:
    """The GPUs (by name) each of `members` holds at `clock`: those of their
    runs not ended by then."""
    return {
        member: frozenset(name for end, name in ends.get(member, ()) if end > clock)
        for member in members
    }


# What keeps one head of a model out while another of the same model may go
# (its passed wait bound, a pin, a band below the reservation's floor, its
# member's running limit):
# a model's top head alone does not say whether the model can run here.
_PER_HEAD_SKIPS = (Skip.OVERDUE, Skip.PINNED, Skip.RESERVED, Skip.RUNNING_LIMIT)


def _decide_over_heads(
    snapshot: Snapshot, heads: Heads, ends: dict[int, list[tuple[float, str]]]
) -> Decision:
    """`decide` over the heads that can win: per model, those with the
    highest rank key (ties within rounding), as affinity lifts a model's
    heads alike (`Heads` keeps them at hand: a step costs O(log heads));
    when a rule that binds head by head keeps one of them out, over every
    head, since that model's other heads may go instead."""
    if snapshot.running_limit is not None:
        members = {head.member_id for head in snapshot.heads}
        snapshot = replace(snapshot, gpus_held=_held_at(snapshot.now, members, ends))
    decision = decide(snapshot)
    if not any(decision.skipped_for(skip) for skip in _PER_HEAD_SKIPS):
        return decision
    everyone = list(heads.by_line.values())
    if snapshot.running_limit is not None:
        members = {head.member_id for head in everyone}
        snapshot = replace(snapshot, gpus_held=_held_at(snapshot.now, members, ends))
    return decide(replace(snapshot, heads=everyone))


def _first_end_of(
    decision: Decision, snapshot: Snapshot, ends: dict[int, list[tuple[float, str]]]
) -> float | None:
    """With nothing eligible, when the first running job of a member kept
    out by the running limit ends (the GPU waits until then); None when no
    such member waits."""
    limited = set(decision.skipped_for(Skip.RUNNING_LIMIT))
    members = {head.member_id for head in snapshot.heads if head.job_id in limited}
    waiting = [end for member in members for end, _ in ends.get(member, ()) if end > snapshot.now]
    return min(waiting) if waiting else None
