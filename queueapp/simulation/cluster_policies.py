"""The policies compared on several GPUs.

`gpusched` is the dispatcher's claim for one GPU of several
(queueapp/dispatch/claim.py): it ranks, with `queueapp.policy.rank`, the
queue-line heads the GPU may take (members under their tier's running
limit, jobs its reservation admits), with swap affinity for that GPU's
resident model; bands, tier bonus, aging and the lane clocks are global.
Then the placement rule: a job whose model is loaded on another idle GPU is
left to that GPU when a job of the same band can go here instead, never one
of a lower band.

The baselines are what people run today: each GPU's own llama-swap (its
FIFO with collation, `baselines.FifoCollate`) behind a load balancer that
sends each request to a GPU when it arrives, round-robin or to the least
busy GPU. Each GPU then works through its own queue; the balancer knows
nothing of bands, members or models.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from queueapp.policy import Candidate, PolicySettings, Reservation, counterfactual_winners
from queueapp.policy.decide import Borrowing, Outcome, Snapshot, decide
from queueapp.policy.facts import (
    DEFAULT_RUNNING_LIMIT,
    ClusterFacts,
    MemberLimits,
    cluster_facts,
)
from queueapp.policy.routing import RoutingConfig
from queueapp.simulation.baselines import POLICIES, FifoCollate, Gpusched
from queueapp.simulation.callers import Callers
from queueapp.simulation.cluster import (
    ClusterPolicy,
    ClusterView,
    GpuView,
    SharedQueue,
    simulate_on_gpus,
)
from queueapp.simulation.engine import Choice, QueuedJob, Run
from queueapp.simulation.fleet import GpuSpec, gpu_specs
from queueapp.simulation.traces import Trace

# `gpusched+reserve` without --reserve: the first GPU keeps out the long
# renders of the lower bands, so interactive work always finds a GPU that
# is not stuck in one.
DEFAULT_RESERVATIONS = {"gpu0": Reservation(min_band=0, max_expected_seconds=60.0)}
# gpusched's default guard (the policy's): a GPU that would stand idle is
# lent past the running limit to any job (docs/benchmarks.md has the sweep
# that chose it).
DEFAULT_BORROWING = Borrowing()


class GpuschedOnGpus:
    """gpusched's claim for the GPU that is idle, among several."""

    def __init__(
        self,
        settings: PolicySettings | None = None,
        *,
        running_limits: Mapping[str, int],
        name: str = "gpusched",
        borrowing: Borrowing | None = None,
        strict_tiers: frozenset[str] = frozenset(),
    ) -> None:
        # Queue-line heads, their candidates and the lane clocks, as on one GPU.
        self.lines = Gpusched(settings)
        self.settings = self.lines.settings
        self.running_limits = running_limits
        self.name = name
        self.borrowing = borrowing
        self.strict_tiers = strict_tiers

    def arrived(self, queued: QueuedJob, *, cluster: ClusterView) -> None:
        return None

    def choose(
        self, queue: Sequence[QueuedJob], *, now: float, gpu: GpuView, cluster: ClusterView
    ) -> Choice | None:
        heads = self.lines.heads(queue)
        if not heads:
            return None
        facts = self._facts(heads.values(), cluster)
        decision = decide(
            Snapshot(
                now=now,
                gpu=cluster.snapshot_of(gpu),
                heads=[self.lines.candidate(queued) for queued in heads.values()],
                settings=self.settings,
                others=[
                    cluster.snapshot_of(other).peer() for other in cluster.gpus if other is not gpu
                ],
                gpus_held=facts.gpus_held,
                running_limit=facts.running_limit,
                borrowing=facts.borrowing,
            )
        )
        if decision.chosen is None:
            return None
        if gpu.sets is not None and decision.outcome is Outcome.FULL:
            return None  # each head waits for its own model's slot
        chosen = decision.chosen.candidate
        without = counterfactual_winners(
            decision.eligible, now=now, resident_model=gpu.resident, settings=self.settings
        )
        changed = frozenset(term for term, winner in without.items() if winner != chosen.job_id)
        return Choice(
            heads[chosen.job_id],
            changed,
            placed=decision.placed,
            borrowed=decision.borrowed,
            drains=decision.outcome is Outcome.DRAIN,
        )

    def _facts(self, heads: Iterable[QueuedJob], cluster: ClusterView) -> ClusterFacts:
        """What the decision rests on, built as the claim builds it
        (policy/facts.py): the heads' members' limits by tier, who may not
        borrow, and the models learned to be short enough."""
        tiers = {queued.member_id: queued.tier for queued in heads}
        guard = self.borrowing
        return cluster_facts(
            enabled_gpus=len(cluster.gpus),
            gpus_held=cluster.gpus_held(),
            limits=MemberLimits(
                limits={
                    member: self.running_limits.get(tier, DEFAULT_RUNNING_LIMIT)
                    for member, tier in tiers.items()
                },
                strict=frozenset(
                    member for member, tier in tiers.items() if tier in self.strict_tiers
                ),
            ),
            keep_idle=guard.keep_idle if guard else 0,
            borrow_max_seconds=guard.max_seconds if guard else None,
            expected_seconds=cluster.learned_seconds,
            lends=guard is not None,
        )

    def dispatched(self, chosen: QueuedJob, *, gpu: GpuView, at: float) -> None:
        self.lines.dispatched(chosen, at=at)

    def queued_candidates(self, queue: Sequence[QueuedJob]) -> list[Candidate]:
        """Every queued job as the forecast reads it (estimates.py)."""
        return [self.lines.candidate(queued) for queued in queue]

    def facts_for(self, queue: Sequence[QueuedJob], cluster: ClusterView) -> ClusterFacts:
        """The facts the forecast plays with: those of the queue's members."""
        return self._facts(queue, cluster)


class Balanced:
    """Each GPU's own llama-swap (FIFO with collation) behind a balancer that
    assigns every request to a GPU at its arrival."""

    name = ""
    rule = ""

    def __init__(self, gpu_count: int) -> None:
        self.gpu_count = gpu_count
        self.assigned: dict[int, int] = {}  # job id -> GPU index
        self.waiting = [0] * gpu_count  # assigned, not started, per GPU
        self.llama_swap = FifoCollate()

    def assign(self, cluster: ClusterView) -> int:
        raise NotImplementedError

    def arrived(self, queued: QueuedJob, *, cluster: ClusterView) -> None:
        index = self.assign(cluster)
        self.assigned[queued.job_id] = index
        self.waiting[index] += 1

    def choose(
        self, queue: Sequence[QueuedJob], *, now: float, gpu: GpuView, cluster: ClusterView
    ) -> Choice | None:
        mine = [queued for queued in queue if self.assigned[queued.job_id] == gpu.index]
        return self.llama_swap.choose(mine, now=now, resident=gpu.resident) if mine else None

    def dispatched(self, chosen: QueuedJob, *, gpu: GpuView, at: float) -> None:
        self.waiting[gpu.index] -= 1


class RoundRobin(Balanced):
    name = "round-robin+collate"
    rule = (
        "a balancer sends the n-th request to GPU n mod N at its arrival; each GPU's "
        "llama-swap serves its own queue FIFO with collation (fifo-collate)"
    )

    def __init__(self, gpu_count: int) -> None:
        super().__init__(gpu_count)
        self.arrivals = 0

    def assign(self, cluster: ClusterView) -> int:
        index = self.arrivals % self.gpu_count
        self.arrivals += 1
        return index


class LeastBusy(Balanced):
    name = "least-busy+collate"
    rule = (
        "a balancer sends each request, at its arrival, to the GPU with the fewest queued "
        "plus running requests (the first such GPU on a tie); each GPU's llama-swap serves "
        "its own queue FIFO with collation (fifo-collate)"
    )

    def assign(self, cluster: ClusterView) -> int:
        def load(index: int) -> tuple[int, int]:
            return (self.waiting[index] + cluster.gpus[index].busy, index)

        return min(range(self.gpu_count), key=load)


GPUSCHED_RULE = (
    "each GPU that frees ranks the heads it may take (members under their tier's running "
    "limit, jobs its reservation admits) with queueapp.policy.rank, swap affinity for its "
    "own resident model; a job whose model is loaded on another idle GPU is left to it "
    "when a job of the same band can go here; a GPU no such head can use is lent to a "
    "member at the limit (borrowing)"
)


@dataclass(frozen=True)
class Setup:
    """What a run sets besides the policy: the reservations that replace
    `gpusched+reserve`'s default, and gpusched's borrowing guard (None:
    every tier strict, as `gpusched-strict`)."""

    reservations: Mapping[str, Reservation] = field(default_factory=dict)
    borrowing: Borrowing | None = DEFAULT_BORROWING


# A factory builds the policy and the GPUs it runs on (a reservation is part
# of the setup compared).
ClusterFactory = Callable[
    [Trace, PolicySettings, int, Setup],
    tuple[ClusterPolicy, list[GpuSpec]],
]


def _gpusched(
    trace: Trace, settings: PolicySettings, count: int, setup: Setup
) -> tuple[ClusterPolicy, list[GpuSpec]]:
    # Unreserved: every GPU takes every job.
    return gpusched_on(trace, settings, borrowing=setup.borrowing), gpu_specs(count)


def _gpusched_strict(
    trace: Trace, settings: PolicySettings, count: int, setup: Setup
) -> tuple[ClusterPolicy, list[GpuSpec]]:
    return gpusched_on(trace, settings, name="gpusched-strict", borrowing=None), gpu_specs(count)


def _gpusched_reserved(
    trace: Trace, settings: PolicySettings, count: int, setup: Setup
) -> tuple[ClusterPolicy, list[GpuSpec]]:
    policy = gpusched_on(trace, settings, name="gpusched+reserve", borrowing=setup.borrowing)
    return policy, gpu_specs(count, setup.reservations or DEFAULT_RESERVATIONS)


def gpusched_on(
    trace: Trace,
    settings: PolicySettings,
    *,
    name: str = "gpusched",
    borrowing: Borrowing | None = DEFAULT_BORROWING,
) -> GpuschedOnGpus:
    """gpusched with the trace's tiers: their running limits, and those strict."""
    tiers = trace.tiers.items()
    return GpuschedOnGpus(
        settings,
        running_limits={tier_name: tier.max_running_jobs for tier_name, tier in tiers},
        strict_tiers=frozenset(tier_name for tier_name, tier in tiers if tier.strict_running_limit),
        name=name,
        borrowing=borrowing,
    )


def _shared(name: str) -> ClusterFactory:
    def build(
        trace: Trace, settings: PolicySettings, count: int, setup: Setup
    ) -> tuple[ClusterPolicy, list[GpuSpec]]:
        return SharedQueue(POLICIES[name](trace, settings)), gpu_specs(count)

    return build


# Report order: the balancers, then gpusched, with every tier's running
# limit strict (no borrowing), then with a reservation.
CLUSTER_POLICIES: dict[str, ClusterFactory] = {
    "round-robin+collate": lambda trace, settings, count, setup: (
        RoundRobin(count),
        gpu_specs(count),
    ),
    "least-busy+collate": lambda trace, settings, count, setup: (
        LeastBusy(count),
        gpu_specs(count),
    ),
    "gpusched": _gpusched,
    "gpusched-strict": _gpusched_strict,
    "gpusched+reserve": _gpusched_reserved,
}
CLUSTER_RULES = {
    "round-robin+collate": RoundRobin.rule,
    "least-busy+collate": LeastBusy.rule,
    "gpusched": GPUSCHED_RULE,
    "gpusched-strict": (
        "gpusched with every tier's running limit strict: a member at the limit waits even "
        "when a GPU stands idle (no borrowing)"
    ),
    "gpusched+reserve": (
        f"gpusched with a GPU reserved (by default {', '.join(f'{name}: {r.describe()}' for name, r in DEFAULT_RESERVATIONS.items())}): "  # noqa: E501
        "a reserved GPU takes a job only when its band is at least min_band or its model's "
        "learned run time is under max_expected_seconds"
    ),
}
# gpusched's setups that read a routing's resident sets when the run has one
# (compare_on_gpus' `routing`); every other policy runs one model at a time.
READS_SETS = frozenset({"gpusched", "gpusched-strict", "gpusched+reserve"})
# gpusched with the sets ignored: a GPU's `one_model_at_a_time`, the row the
# sets are measured against.
ONE_MODEL = "gpusched-one-model"
ONE_MODEL_RULE = (
    "gpusched with the routing's sets ignored (a GPU's one_model_at_a_time): one model's "
    "jobs at a time per GPU, every load unloading the rest"
)
# The one-GPU policies, each on one queue that every GPU takes from.
SHARED_QUEUE_POLICIES: dict[str, ClusterFactory] = {
    name: _shared(name) for name in POLICIES if name not in CLUSTER_POLICIES
}


def _one_model(
    trace: Trace, settings: PolicySettings, count: int, setup: Setup
) -> tuple[ClusterPolicy, list[GpuSpec]]:
    return gpusched_on(trace, settings, name=ONE_MODEL, borrowing=setup.borrowing), gpu_specs(count)


def cluster_policy_names() -> list[str]:
    return [*CLUSTER_POLICIES, *SHARED_QUEUE_POLICIES, ONE_MODEL]


def compare_on_gpus(
    trace: Trace,
    gpu_count: int,
    names: Sequence[str] | None = None,
    settings: PolicySettings | None = None,
    reservations: Mapping[str, Reservation] | None = None,
    parallel: Mapping[str, int] | None = None,
    borrowing: Borrowing | None = DEFAULT_BORROWING,
    callers: Callers | None = None,
    routing: RoutingConfig | None = None,
    forecasts: bool = False,
) -> list[Run]:
    """Each named policy (the balancers and gpusched's setups by default)
    on `gpu_count` GPUs, each from an empty memory. `reservations` replace
    `gpusched+reserve`'s default; `parallel` gives models their slots;
    `borrowing` is gpusched's guard (the policy's borrow_* settings);
    `callers`, who bounds their wait and who leaves mid-run; `routing`,
    llama-swap's sets, which gpusched's setups read (`READS_SETS`, their
    runs named `NAME+sets`) and the others ignore."""
    factories = {**CLUSTER_POLICIES, **SHARED_QUEUE_POLICIES, ONE_MODEL: _one_model}
    runs = []
    for name in names or CLUSTER_POLICIES:
        if name not in factories:
            raise KeyError(f"unknown policy {name!r}; choose from {', '.join(factories)}")
        policy, gpus = factories[name](
            trace,
            settings or PolicySettings(),
            gpu_count,
            Setup(reservations=reservations or {}, borrowing=borrowing),
        )
        sets = routing if name in READS_SETS else None
        run = simulate_on_gpus(
            trace,
            policy,
            gpus,
            parallel=parallel,
            callers=callers,
            routing=sets,
            forecasts=forecasts,
        )
        if sets is not None:
            run.policy = f"{run.policy}+sets"
        runs.append(run)
    return runs
