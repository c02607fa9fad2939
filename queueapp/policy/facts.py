"""The facts every decision rests on, worked out once.

`decide` (decide.py) reads a `Snapshot`; this module says how the facts in
it follow from rows, so the claim (queueapp/dispatch/snapshot.py), the
forecast (queueapp/eta.py), the policy simulator, `why` and the front
door's admission build them the same way:

- whether a GPU is alone (`gpus_alone`): one enabled GPU, whether its
  dispatcher runs now or not (one that restarts must not hand its models
  to the others). Alone, it runs any model the operator allows and no
  running limit binds (the limit counts GPUs, and a member may share the
  GPU it holds);
- the models a GPU runs (`models_run`);
- the running limit per member (`MemberLimits`, `DEFAULT_RUNNING_LIMIT`)
  and who may borrow past it (`borrowing_guard`); who is at it on a GPU is
  `decide`'s rule, and so is the claim's pre-filter (decide.prefilter);
- the models known to run short (`models_shorter_than`), for a
  reservation's bound and for the borrowing guard;
- a queued job's candidate (`queued_candidate`), its lane clock included
  (`lane_eligible_at`).

`cluster_facts` builds those of one instant from the rows (`ClusterFacts`),
which the snapshot of each GPU then reads. No Django here, as in the rest
of the policy.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from queueapp.policy.decide import Borrowing
from queueapp.policy.placement import Reservation
from queueapp.policy.score import Candidate

# The running limit of a member whose tier is not known to the decision (a
# tier allows at least one: tier_max_running_jobs_at_least_one).
DEFAULT_RUNNING_LIMIT = 1


def gpus_alone(enabled_gpus: int) -> bool:
    """Whether a GPU is alone: one enabled GPU (or none registered)."""
    return enabled_gpus <= 1


def models_run(
    served: Sequence[str] | None, allowed: Sequence[str], *, alone: bool
) -> frozenset[str] | None:
    """The models a GPU may be given: those llama-swap serves, narrowed by
    the operator's `allowed` list; None (any model) when the served list is
    not read yet and nothing narrows it. Alone, it is given any model but
    those the operator left out, as a single llama-swap is (models
    llama-swap does not list, `unlisted` ones included, are its to answer)."""
    if served is None or alone:
        return frozenset(allowed) or None
    if not allowed:
        return frozenset(served)
    return frozenset(model for model in served if model in allowed)


def models_shorter_than(
    expected_seconds: Mapping[str, float], bound: float | None
) -> frozenset[str] | None:
    """The models whose expected run (`expected_seconds`, per model: its
    longest learned path) is under `bound`; None without a bound. A model
    not learned yet is not among them: a GPU reserved for short work, or a
    GPU lent for short work, does not gamble on it."""
    return Reservation(max_expected_seconds=bound).short_models(expected_seconds)


def lane_eligible_at(*, submitted_at: float, lane_clock: float | None) -> float:
    """When a job behind its line's head starts to age: the later of its
    submission and its lane's last dispatch (queueapp/lanes.py)."""
    return max(submitted_at, lane_clock) if lane_clock is not None else submitted_at


def queued_candidate(
    *,
    job_id: int,
    band: int,
    tier_bonus: float,
    model: str,
    submitted_at: float,
    member_id: int,
    is_lane_head: bool,
    eligible_at: float,
    lane_clock: float | None = None,
    pinned_gpu: str | None = None,
    wait_deadline: float | None = None,
    shortness: float = 0.0,
    expected_seconds: float | None = None,
) -> Candidate:
    """A queued job as the policy sees it (times in unix seconds). A line's
    head carries its own `eligible_at`; a job behind it ages from its
    lane's clock (`lane_eligible_at`)."""
    if not is_lane_head:
        eligible_at = lane_eligible_at(submitted_at=submitted_at, lane_clock=lane_clock)
    return Candidate(
        job_id=job_id,
        band=band,
        tier_bonus=tier_bonus,
        model=model,
        submitted_at=submitted_at,
        eligible_at=eligible_at,
        member_id=member_id,
        pinned_gpu=pinned_gpu or None,
        wait_deadline=wait_deadline,
        shortness=shortness,
        expected_seconds=expected_seconds,
    )


@dataclass(frozen=True)
class MemberLimits:
    """Each member's running limit (GPUs their running jobs may hold at
    once, their tier's) and the members whose tier keeps it strict."""

    limits: Mapping[int, int] = field(default_factory=dict)
    strict: frozenset[int] = frozenset()

    def of(self, member_id: int) -> int:
        return self.limits.get(member_id, DEFAULT_RUNNING_LIMIT)


def borrowing_guard(
    *,
    keep_idle: int,
    max_seconds: float | None,
    expected_seconds: Mapping[str, float],
    strict_members: Iterable[int],
) -> Borrowing:
    """The policy's borrowing guard as `decide` reads it: lend an idle GPU
    only while `keep_idle` others stand idle, and only for the models known
    to run under `max_seconds`; never to `strict_members`."""
    return Borrowing(
        keep_idle=keep_idle,
        max_seconds=max_seconds,
        short_models=models_shorter_than(expected_seconds, max_seconds) or frozenset(),
        strict_members=frozenset(strict_members),
    )


@dataclass(frozen=True)
class ClusterFacts:
    """What the decisions on every GPU share at one instant: whether a GPU
    is alone, who holds which GPUs, the running limits, the borrowing guard
    and what each model is expected to run (per model: its longest learned
    path, in seconds)."""

    alone: bool
    gpus_held: Mapping[int, frozenset[str]] = field(default_factory=dict)
    limits: MemberLimits = MemberLimits()
    # Who may borrow a GPU past the running limit; None: nobody.
    guard: Borrowing | None = None
    expected_seconds: Mapping[str, float] = field(default_factory=dict)

    @property
    def running_limit(self) -> Callable[[int], int] | None:
        """A member's running limit; None alone: it counts GPUs held, and a
        member may share the one GPU."""
        return None if self.alone else self.limits.of

    @property
    def borrowing(self) -> Borrowing | None:
        return None if self.alone else self.guard

    def runs(self, served: Sequence[str] | None, allowed: Sequence[str]) -> frozenset[str] | None:
        """The models a GPU with these lists runs (`models_run`)."""
        return models_run(served, allowed, alone=self.alone)

    def short_models(self, bound: float | None) -> frozenset[str] | None:
        """A reservation's short models: those known to run under `bound`."""
        return models_shorter_than(self.expected_seconds, bound)


def cluster_facts(
    *,
    enabled_gpus: int,
    gpus_held: Mapping[int, frozenset[str]],
    limits: MemberLimits,
    keep_idle: int = 0,
    borrow_max_seconds: float | None = None,
    expected_seconds: Mapping[str, float] | None = None,
    lends: bool = True,
) -> ClusterFacts:
    """The facts the decisions of one instant rest on, from the snapshot's
    rows (`lends` False: no member borrows past the running limit)."""
    expected = expected_seconds or {}
    return ClusterFacts(
        alone=gpus_alone(enabled_gpus),
        gpus_held=gpus_held,
        limits=limits,
        guard=borrowing_guard(
            keep_idle=keep_idle,
            max_seconds=borrow_max_seconds,
            expected_seconds=expected,
            strict_members=limits.strict,
        )
        if lends
        else None,
        expected_seconds=expected,
    )
