"""The policies the simulator compares, each behind the engine's one interface.

The baselines model llama-swap's schedulers (internal/router/scheduler/fifo.go
in mostlygeek/llama-swap) and an engine's priority field on one GPU that runs
one job at a time. `Gpusched` is not a model of gpusched: it calls the
dispatcher's own functions (`rank`, `counterfactual_winners`) on the same
inputs the claim builds from its rows (queueapp/dispatch/claim.py,
queueapp/lanes.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from queueapp.policy import Candidate, PolicySettings, counterfactual_winners
from queueapp.policy.decide import GpuSnapshot, Snapshot, decide
from queueapp.policy.facts import queued_candidate
from queueapp.policy.score import shortness
from queueapp.simulation.engine import Choice, QueuedJob, Run, SchedulingPolicy, simulate
from queueapp.simulation.traces import Trace


def _earliest(queue: Sequence[QueuedJob]) -> QueuedJob:
    return min(queue, key=lambda queued: queued.job_id)


class _Stateless:
    name = ""

    def dispatched(self, chosen: QueuedJob, *, at: float) -> None:
        return None


class Fifo(_Stateless):
    """Arrival order, whatever the model: llama-swap's classic behaviour."""

    name = "fifo"
    rule = "the earliest request goes next, swapping models whenever the next one needs another"

    def choose(self, queue: Sequence[QueuedJob], *, now: float, resident: str | None) -> Choice:
        return Choice(_earliest(queue))


class FifoCollate(_Stateless):
    """llama-swap's FIFO today: requests for the loaded model skip the queue."""

    name = "fifo-collate"
    rule = (
        "requests for the loaded model go first, in arrival order (llama-swap's fast path, "
        "A B A B -> A A B B); only when none is left does the earliest request swap"
    )

    def choose(self, queue: Sequence[QueuedJob], *, now: float, resident: str | None) -> Choice:
        loaded = [queued for queued in queue if queued.model == resident]
        return Choice(_earliest(loaded or queue))


class ModelPriority(_Stateless):
    """llama-swap's FIFO with its per-model `priority` setting."""

    name = "model-priority"
    rule = (
        "requests for the loaded model go first; when a swap is needed, the request whose "
        "model has the highest configured priority goes first, arrival order among equals"
    )

    def __init__(self, model_priority: dict[str, int]) -> None:
        self.model_priority = model_priority

    def choose(self, queue: Sequence[QueuedJob], *, now: float, resident: str | None) -> Choice:
        loaded = [queued for queued in queue if queued.model == resident]
        if loaded:
            return Choice(_earliest(loaded))
        return Choice(min(queue, key=lambda q: (-self.model_priority.get(q.model, 0), q.job_id)))


class StrictPriority(_Stateless):
    """A priority field as inference engines accept it (vLLM's `priority`)."""

    name = "strict-priority"
    rule = (
        "the highest requested priority (after the tier cap) goes first, arrival order among "
        "equals; no aging, no tier bonus, no affinity"
    )

    def choose(self, queue: Sequence[QueuedJob], *, now: float, resident: str | None) -> Choice:
        return Choice(min(queue, key=lambda queued: (-queued.band, queued.job_id)))


class Gpusched:
    """The dispatcher's choice, made by the dispatcher's functions.

    The claim ranks queue-line heads: the first job by (submission, id) of
    each (member, band, model). A head's `eligible_at` is the later of its
    submission and its lane's last dispatch (queueapp/lanes.py keeps exactly
    that in the row; `selectors.job_candidate` computes it the same way), so
    the lane clock is the only memory this policy needs.
    """

    name = "gpusched"
    rule = (
        "the highest band + tier bonus + swap affinity + aging (from the later of submission "
        "and the member's last dispatch in the band), computed by queueapp.policy.rank"
    )

    def __init__(self, settings: PolicySettings | None = None) -> None:
        self.settings = settings or PolicySettings()
        self.lane_clocks: dict[tuple[int, int], float] = {}

    def heads(self, queue: Sequence[QueuedJob]) -> dict[int, QueuedJob]:
        first: dict[tuple[int, int, str], QueuedJob] = {}
        for queued in queue:
            line = (queued.member_id, queued.band, queued.model)
            current = first.get(line)
            if current is None or (queued.submitted_at, queued.job_id) < (
                current.submitted_at,
                current.job_id,
            ):
                first[line] = queued
        return {queued.job_id: queued for queued in first.values()}

    def candidate(self, queued: QueuedJob) -> Candidate:
        """A queue line's head as the policy sees it: aging from its lane's
        clock (policy/facts.py, as the claim reads a row)."""
        return queued_candidate(
            job_id=queued.job_id,
            band=queued.band,
            tier_bonus=queued.tier_bonus,
            model=queued.model,
            submitted_at=queued.submitted_at,
            member_id=queued.member_id,
            # Replayed heads carry no eligible_at of their own: they age
            # from their lane's clock, as a job behind a head does.
            is_lane_head=False,
            eligible_at=queued.submitted_at,
            lane_clock=self.lane_clocks.get((queued.member_id, queued.band)),
            shortness=shortness(queued.expected_seconds, self.settings),
        )

    def choose(self, queue: Sequence[QueuedJob], *, now: float, resident: str | None) -> Choice:
        """`decide` on one GPU that runs every model, over the lines' heads."""
        heads = self.heads(queue)
        decision = decide(
            Snapshot(
                now=now,
                gpu=GpuSnapshot("gpu", resident_model=resident),
                heads=[self.candidate(queued) for queued in heads.values()],
                settings=self.settings,
            )
        )
        assert decision.chosen is not None  # one idle GPU, no rule keeps a head out
        chosen = decision.chosen.candidate
        without = counterfactual_winners(
            decision.eligible, now=now, resident_model=resident, settings=self.settings
        )
        changed = frozenset(term for term, winner in without.items() if winner != chosen.job_id)
        return Choice(heads[chosen.job_id], changed)

    def dispatched(self, chosen: QueuedJob, *, at: float) -> None:
        self.lane_clocks[(chosen.member_id, chosen.band)] = at


PolicyFactory = Callable[[Trace, PolicySettings], SchedulingPolicy]

# Report order: the baselines, then gpusched.
POLICIES: dict[str, PolicyFactory] = {
    "fifo": lambda trace, settings: Fifo(),
    "fifo-collate": lambda trace, settings: FifoCollate(),
    "model-priority": lambda trace, settings: ModelPriority(trace.model_priority),
    "strict-priority": lambda trace, settings: StrictPriority(),
    "gpusched": lambda trace, settings: Gpusched(settings),
}
RULES = {
    "fifo": Fifo.rule,
    "fifo-collate": FifoCollate.rule,
    "model-priority": ModelPriority.rule,
    "strict-priority": StrictPriority.rule,
    "gpusched": Gpusched.rule,
}


def make_policy(
    name: str, trace: Trace, settings: PolicySettings | None = None
) -> SchedulingPolicy:
    """A fresh policy (its memory empty) for one run."""
    if name not in POLICIES:
        raise KeyError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}")
    return POLICIES[name](trace, settings or PolicySettings())


def compare(
    trace: Trace, names: Sequence[str] | None = None, settings: PolicySettings | None = None
) -> list[Run]:
    """Each named policy (all by default) on the same trace, each from an empty memory."""
    return [simulate(trace, make_policy(name, trace, settings)) for name in names or POLICIES]
