"""Which job a GPU takes now: every rule of it in one pure function.

The claim (queueapp/dispatch/claim.py), the forecast (forecast.py) and the
policy simulator (queueapp/simulation/cluster_policies.py) each describe
what they know as a `Snapshot` and call `decide`, so the dispatcher, the
estimates, `why` and the simulator cannot disagree about a rule. They differ
only in where the snapshot comes from: rows of PostgreSQL, a virtual clock,
a trace.

The rules, in the order they apply (Kueue's snapshot, nominate, admit):

1. A GPU with every slot taken takes nothing (`FULL`): one slot, unless the
   model in flight has `parallel` N > 1. With resident sets (llama-swap's
   routing keeps several models loaded together: resident_sets.py), each
   model has its own slots, and the GPU is full when no model could start.
2. A paused dispatch or a disabled GPU takes nothing (`STOPPED`).
3. Each queue-line head is eligible unless a rule keeps it off this GPU,
   and then the `Skip` reason goes with it:
   - `OVERDUE`: its wait bound has passed (`wait_deadline`): it expires,
     it never starts (queueapp/policy/wait_bound.py);
   - `PINNED`: the job may run only on another GPU (a preload that named
     its GPU);
   - `NOT_SERVED`: the GPU does not run its model;
   - `RESERVED`: the GPU's reservation admits only jobs of at least its
     band floor, or of the models known to run short (placement.py);
   - `RUNNING_LIMIT`: its member's running jobs hold as many GPUs as the
     tier allows, none of them this one (a member may share a GPU it holds).
     GPUs, not jobs: counting jobs would make one client's four concurrent
     chats wait for each other behind a server that answers four at once.
   When no head is eligible and some were kept out only by the running
   limit, the GPU would stand idle while work waits: those heads may
   borrow it (`Borrowing`: the limit is a share under contention, not a
   cap), unless their tier is strict or the guard refuses. The decision
   says `borrowed`.
4. The eligible heads are ranked by the score (score.py), with swap
   affinity for the model loaded here: the one in flight, else the
   resident one.
5. Placement (placement.py): a leader whose model is loaded on another idle,
   unreserved GPU is left to it when a job of its band needs no swap here
   (never a job pinned here: no other GPU may take it).
6. With jobs in flight, a winner of another model makes the GPU drain
   (`DRAIN`): no new slot until they all end, so a stream of short jobs can
   never hold a swap off. Otherwise the winner starts (`START`) in the
   lowest free slot. A drain is decided afresh at each claim, never
   committed to: when a job of the model in flight comes to outrank the
   one drained for (a higher band arrives), or another GPU takes that one,
   the slots open again; a commitment would let a lower band hold a
   higher one. With resident sets, a job starts beside jobs in flight of
   other models when its model runs or loads without unloading a busy
   one; a winner that would unload a busy model drains for it, and only
   jobs that change nothing start meanwhile (`_beside_in_flight`).

No Django here: the claim's SQL reads the snapshot and may pre-filter the
heads by these rules where an index helps (tests/dispatch/test_decide_prefilter.py
checks that the pre-filter never drops a job `decide` would pick).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from itertools import takewhile

from queueapp.policy.gpu_snapshot import (
    GpuSnapshot,
    PeerGpu,
    Skip,
    loaded_on_idle_gpus,
)
from queueapp.policy.placement import PLACEMENT_LOOKAHEAD, placed_here
from queueapp.policy.resident_sets import ResidentSet, Room
from queueapp.policy.score import (
    Candidate,
    Loaded,
    PolicySettings,
    RankedCandidate,
    rank,
    runs_short,
)

__all__ = [
    "SKIP_REASONS",
    "Borrowing",
    "Decision",
    "GpuSnapshot",
    "HeadFilter",
    "Outcome",
    "PeerGpu",
    "Skip",
    "Snapshot",
    "at_running_limit",
    "decide",
    "loaded_on_idle_gpus",
    "prefilter",
]


class Outcome(StrEnum):
    START = "start"  # `job` starts in `slot`
    DRAIN = "drain"  # `job`, of another model, waits for the jobs in flight to end
    FULL = "full"  # every slot is taken
    STOPPED = "stopped"  # dispatch is paused, or the GPU is disabled
    NOTHING = "nothing"  # no queued job may run here (`skipped` says why, head by head)


@dataclass(frozen=True)
class Borrowing:
    """Work conservation: who may borrow an idle GPU past the running limit,
    and the guard that keeps a borrowed GPU from delaying later arrivals.

    Jobs are never interrupted, so a GPU lent to a member at its limit is
    not there for the next member who arrives. The guard (the policy's
    borrow_keep_idle_gpus and borrow_max_seconds) lends a GPU only while
    `keep_idle` other GPUs still stand idle for such an arrival, and only
    for jobs expected to run under `max_seconds`: those of `short_models`,
    the models known to run under it (a model not yet learned is not). Both
    are off by default: the policy simulator's numbers chose that
    (docs/benchmarks.md).
    """

    keep_idle: int = 0
    max_seconds: float | None = None
    short_models: frozenset[str] = frozenset()
    # Members whose tier keeps the strict cap: they never borrow.
    strict_members: frozenset[int] = frozenset()

    def lends_to(self, candidate: Candidate) -> bool:
        if candidate.member_id in self.strict_members:
            return False
        return self.max_seconds is None or runs_short(
            candidate, self.max_seconds, self.short_models
        )


SKIP_REASONS = {
    Skip.OVERDUE: "its wait bound has passed: it expires",
    Skip.PINNED: "it may run only on another GPU",
    Skip.NOT_SERVED: "this GPU does not serve its model",
    Skip.RESERVED: "this GPU's reservation keeps it out",
    Skip.RUNNING_LIMIT: "its member holds as many GPUs as the tier's running limit",
}


def at_running_limit(
    member_id: int, *, gpu: str, gpus_held: Mapping[int, frozenset[str]], limit: int
) -> bool:
    """A member whose running jobs hold `limit` GPUs or more, none of them
    `gpu`: jobs sharing one GPU's slots hold one, and a member may share a
    GPU it holds."""
    held = gpus_held.get(member_id, frozenset())
    return gpu not in held and len(held) >= limit


@dataclass(frozen=True)
class Snapshot:
    """What one decision for `gpu` needs: the clock, the queue-line heads it
    may choose from, the other GPUs, who holds which GPUs, and the policy."""

    now: float  # unix seconds
    gpu: GpuSnapshot
    heads: Sequence[Candidate]
    settings: PolicySettings
    # The other GPUs (their resident models guide placement).
    others: Sequence[PeerGpu] = ()
    # Per member, the names of the GPUs their running jobs hold.
    gpus_held: Mapping[int, frozenset[str]] = field(default_factory=dict)
    # A member's running limit (GPUs held at once); None: no limit binds
    # (one GPU: the limit counts GPUs, and a member may share the one it holds).
    running_limit: Callable[[int], int] | None = None
    # Who may borrow a GPU that would stand idle past that limit, and the
    # guard; None: nobody (the limit is a strict cap).
    borrowing: Borrowing | None = None
    paused: bool = False

    def closed(self) -> Outcome | None:
        """FULL or STOPPED when the GPU takes no job whatever is queued."""
        if self.gpu.free_slot() is None:
            return Outcome.FULL
        if self.paused or not self.gpu.enabled:
            return Outcome.STOPPED
        return None

    def skip_reason(self, candidate: Candidate) -> Skip | None:
        if candidate.wait_deadline is not None and candidate.wait_deadline <= self.now:
            return Skip.OVERDUE
        kept_out = self.gpu.keeps_out(candidate)
        if kept_out is not None:
            return kept_out
        if self.running_limit is not None and at_running_limit(
            candidate.member_id,
            gpu=self.gpu.name,
            gpus_held=self.gpus_held,
            limit=self.running_limit(candidate.member_id),
        ):
            return Skip.RUNNING_LIMIT
        return None

    def borrowers(self, skipped: Mapping[int, Skip]) -> list[Candidate]:
        """The heads kept off only by the running limit that may borrow this
        GPU, which no other head can use; none when the guard refuses."""
        borrowing = self.borrowing
        limited = [head for head in self.heads if skipped.get(head.job_id) is Skip.RUNNING_LIMIT]
        if borrowing is None or not limited:
            return []
        if borrowing.keep_idle:
            idle_elsewhere = sum(
                1
                for other in self.others
                if other.claiming and other.idle and other.name != self.gpu.name
            )
            if idle_elsewhere < borrowing.keep_idle:
                return []
        return [head for head in limited if borrowing.lends_to(head)]


@dataclass(frozen=True)
class Decision:
    outcome: Outcome
    # The eligible heads ranked, the chosen one first (START and DRAIN): as
    # many as `decide`'s `top` asked for.
    ranked: tuple[RankedCandidate, ...] = ()
    slot: int | None = None  # START: the slot it takes
    # START: the leading entries of `ranked` that may take `slot`, in order
    # (a claim whose winner is being started elsewhere takes the next): all
    # of them on an idle GPU, beside jobs in flight those of their model up
    # to the first of another, which would make the GPU drain instead.
    startable: tuple[RankedCandidate, ...] = ()
    in_flight: int = 0  # jobs on the GPU before the one that starts
    placed: bool = False  # the leader was left to another GPU where its model is loaded
    # The chosen job borrows the GPU past its member's running limit: no
    # other head could use it (Borrowing).
    borrowed: bool = False
    affinity_model: str | None = None  # the model recorded as resident
    loaded: Loaded = None  # what swap affinity was scored for (GpuSnapshot.loaded)
    # Every head kept off this GPU, and why.
    skipped: Mapping[int, Skip] = field(default_factory=dict)
    eligible: tuple[Candidate, ...] = ()

    @property
    def chosen(self) -> RankedCandidate | None:
        return self.ranked[0] if self.ranked else None

    @property
    def reason(self) -> str:
        """One line for logs and tests."""
        if self.outcome is Outcome.START:
            beyond = " beyond its member's running limit" if self.borrowed else ""
            return f"job {self.ranked[0].candidate.job_id} starts in slot {self.slot}{beyond}"
        if self.outcome is Outcome.DRAIN:
            job = self.ranked[0].candidate
            return f"job {job.job_id} ({job.model}) waits for the jobs in flight to end"
        if self.outcome is Outcome.NOTHING and self.skipped:
            reasons = sorted({SKIP_REASONS[skip] for skip in self.skipped.values()})
            return f"no queued job may run here: {'; '.join(reasons)}"
        return {
            Outcome.FULL: "every slot is taken",
            Outcome.STOPPED: "dispatch is paused or the GPU is disabled",
            Outcome.NOTHING: "nothing is queued",
        }[self.outcome]

    def skipped_for(self, skip: Skip) -> list[int]:
        return [job_id for job_id, reason in self.skipped.items() if reason is skip]


@dataclass(frozen=True)
class HeadFilter:
    """The heads `decide` would keep off a GPU whatever else is queued, as
    the claim's SQL leaves them out where an index helps: those of models
    the GPU does not run, those pinned to another GPU, those its
    reservation keeps out and those of members at their running limit.
    `affinity_models`: the models swap affinity is scored for (their heads
    are read too: the bonus may lift one above the best by key)."""

    gpu: str
    models: frozenset[str] | None
    affinity_models: frozenset[str]
    min_band: int | None
    short_models: frozenset[str] | None
    short_under: float | None = None  # the reservation's bound: a job's own estimate under it
    # Members at their running limit on this GPU, left out.
    capped_members: frozenset[int] = frozenset()
    # Among them, those who may borrow it when no other head can use it.
    may_borrow: frozenset[int] = frozenset()

    @property
    def reserved(self) -> bool:
        return self.min_band is not None or self.short_models is not None

    def runs(self, model: str) -> bool:
        return self.models is None or model in self.models

    def with_borrowers(self) -> HeadFilter:
        """The filter for the second read, when nothing else may take the
        GPU: the members who may borrow it are no longer left out."""
        return replace(
            self, capped_members=self.capped_members - self.may_borrow, may_borrow=frozenset()
        )


def prefilter(snapshot: Snapshot) -> HeadFilter:
    """What of the queue `snapshot.gpu` can never take now, by `decide`'s
    rules (tests/dispatch/test_decide_prefilter.py holds the two together)."""
    gpu = snapshot.gpu
    capped: frozenset[int] = frozenset()
    if snapshot.running_limit is not None:
        limit = snapshot.running_limit
        capped = frozenset(
            member
            for member in snapshot.gpus_held
            if at_running_limit(
                member, gpu=gpu.name, gpus_held=snapshot.gpus_held, limit=limit(member)
            )
        )
    lending = snapshot.borrowing
    loaded = gpu.loaded
    affinity = frozenset((loaded,) if isinstance(loaded, str) else loaded or ())
    if gpu.runs_models is not None:
        affinity &= gpu.runs_models
    return HeadFilter(
        gpu=gpu.name,
        models=gpu.runs_models,
        affinity_models=affinity,
        min_band=gpu.min_band,
        short_models=gpu.short_models,
        short_under=gpu.short_under,
        capped_members=capped,
        may_borrow=frozenset()
        if lending is None
        else frozenset(member for member in capped if member not in lending.strict_members),
    )


def decide(snapshot: Snapshot, *, top: int = PLACEMENT_LOOKAHEAD) -> Decision:
    """Which job `snapshot.gpu` takes now, or why none (the module says the
    rules). `top`: how many of the ranking get their terms (at least the
    placement's look-ahead)."""
    gpu = snapshot.gpu
    closed = snapshot.closed()
    if closed is not None:
        return Decision(closed)
    eligible: list[Candidate] = []
    skipped: dict[int, Skip] = {}
    if (
        gpu.runs_models is None
        and not gpu.reserved
        and snapshot.running_limit is None
        and not any(head.pinned_gpu or head.wait_deadline for head in snapshot.heads)
    ):
        eligible = list(snapshot.heads)  # no rule keeps a head out: the claim's common case
    else:
        for head in snapshot.heads:
            skip = snapshot.skip_reason(head)
            if skip is None:
                eligible.append(head)
            else:
                skipped[head.job_id] = skip
    borrowed = False
    if not eligible:
        eligible = snapshot.borrowers(skipped)
        if not eligible:
            return Decision(Outcome.NOTHING, skipped=skipped)
        borrowed = True
    loaded = gpu.loaded
    ranked = rank(
        eligible,
        now=snapshot.now,
        resident_model=loaded,
        settings=snapshot.settings,
        top=max(top, PLACEMENT_LOOKAHEAD),
    )
    chosen = placed_here(
        ranked,
        resident_model=loaded,
        loaded_elsewhere=loaded_on_idle_gpus(snapshot.others, besides=gpu.name),
    )
    ordered = (chosen, *(entry for entry in ranked if entry is not chosen))
    startable = ordered
    outcome_if_none = Outcome.DRAIN
    if gpu.slots_taken and gpu.beside is not None:
        startable, drains = _beside_in_flight(gpu.beside, ordered)
        outcome_if_none = Outcome.DRAIN if drains else Outcome.FULL
        # The job that starts leads the ranking it is recorded with.
        ordered = (*startable[:1], *(entry for entry in ordered if entry not in startable[:1]))
    elif gpu.slots_taken:
        startable = tuple(
            takewhile(lambda entry: entry.candidate.model == gpu.in_flight_model, ordered)
        )
    waiting = not startable
    return Decision(
        outcome_if_none if waiting else Outcome.START,
        ranked=ordered,
        slot=None if waiting else gpu.free_slot(),
        startable=startable,
        in_flight=len(gpu.slots_taken),
        placed=chosen is not ranked[0],
        borrowed=borrowed,
        affinity_model=gpu.affinity_model,
        loaded=loaded,
        skipped=skipped,
        eligible=tuple(eligible),
    )


def _beside_in_flight(
    sets: ResidentSet, ordered: Sequence[RankedCandidate]
) -> tuple[tuple[RankedCandidate, ...], bool]:
    """With resident sets (resident_sets.py): the ranked heads that may
    start beside the jobs in flight, in order, and whether the GPU drains
    (the best head that is not waiting for its own model's slot would
    unload a busy model). A head at its model's cap holds up nobody; once
    one drains, only heads that change nothing start."""
    startable: list[RankedCandidate] = []
    drained_for: str | None = None
    for entry in ordered:
        model = entry.candidate.model
        if drained_for is not None:
            if sets.starts_during_drain(model, drained_for=drained_for):
                startable.append(entry)
            continue
        room = sets.room(model)
        if room is Room.START:
            startable.append(entry)
        elif room is Room.UNLOADS_BUSY:
            drained_for = model
    return tuple(startable), drained_for is not None and not startable
