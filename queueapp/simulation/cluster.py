"""Several GPUs behind one queue (or one balancer), on the virtual clock.

Each GPU runs one job at a time, never interrupted, and pays a swap by the
same rule as the one-GPU engine (`queueapp.policy.occupancy_seconds`). The
clock moves from event to event: a submission, or the end of a job. At each
instant the jobs that ended free their GPU first, then the jobs submitted by
then are queued (a balancer assigns each to a GPU now: that is what a
balancer does), then every idle GPU, in name order, asks the policy for a
job, as each GPU's dispatcher claims when it frees. Only an event changes
what an idle GPU may take (a member's running limit frees at an end, a
model's learned run time changes at an end, new work arrives), so a GPU
given nothing waits for the next one.

With one GPU and a one-GPU policy this is `engine.simulate` dispatch for
dispatch (tests/simulation/test_cluster.py replays every committed trace
through both).

A reservation keeps a GPU for some work: it admits a job when its band is at
least `min_band`, or when its model's expected run time is under
`max_expected_seconds`, the rule of `queueapp.policy.Reservation`. The expected run time is
what the live dispatcher learns: the mean of the model's runs finished so
far (without swap); a model with none finished is not known to be short, so
only its band can admit it.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from queueapp.policy import BAND_ALIASES, Reservation
from queueapp.policy.occupancy import occupancy_seconds
from queueapp.simulation.engine import (
    Arrivals,
    Choice,
    Dispatch,
    QueuedJob,
    Run,
    SchedulingPolicy,
)
from queueapp.simulation.traces import Trace

RESERVATION_EXAMPLE = "gpu0:min_band=0,max_expected_seconds=60"


class ReservationError(ValueError):
    """A --reserve argument that cannot be read or names no GPU of the run."""


@dataclass(frozen=True)
class GpuSpec:
    name: str
    reservation: Reservation | None = None


def gpu_names(count: int) -> list[str]:
    """gpu0, gpu1, ...: the names the live system gives bare upstream URLs."""
    return [f"gpu{index}" for index in range(count)]


def gpu_specs(count: int, reservations: Mapping[str, Reservation] | None = None) -> list[GpuSpec]:
    if count < 1:
        raise ValueError(f"at least one GPU, got {count}")
    names = gpu_names(count)
    reservations = reservations or {}
    unknown = sorted(set(reservations) - set(names))
    if unknown:
        raise ReservationError(
            f"no GPU named {', '.join(unknown)} among the {count} simulated ({', '.join(names)})"
        )
    return [GpuSpec(name, reservations.get(name)) for name in names]


def parse_reservation(text: str) -> tuple[str, Reservation]:
    """`gpu0:min_band=0,max_expected_seconds=60` -> ("gpu0", Reservation(0, 60.0)).

    A band is a number or a priority alias (interactive, normal, batch)."""
    name, sep, settings = text.partition(":")
    name = name.strip()
    if not sep or not name or not settings.strip():
        raise ReservationError(
            f"bad reservation {text!r}: expected GPU:SETTING=VALUE,... e.g. {RESERVATION_EXAMPLE}"
        )
    values: dict[str, str] = {}
    for item in settings.split(","):
        key, eq, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or not value:
            raise ReservationError(
                f"bad reservation {text!r}: {item.strip()!r} is not SETTING=VALUE"
            )
        if key not in ("min_band", "max_expected_seconds"):
            raise ReservationError(
                f"unknown reservation setting {key!r}; choose from min_band, max_expected_seconds"
            )
        if key in values:
            raise ReservationError(f"{key} is given twice in {text!r}")
        values[key] = value
    min_band = None
    if "min_band" in values:
        raw = values["min_band"]
        if raw.lower() in BAND_ALIASES:
            min_band = BAND_ALIASES[raw.lower()]
        else:
            try:
                min_band = int(raw)
            except ValueError:
                raise ReservationError(
                    f"min_band: {raw!r} is not a whole number or a priority alias "
                    f"({', '.join(BAND_ALIASES)})"
                ) from None
    max_seconds = None
    if "max_expected_seconds" in values:
        raw = values["max_expected_seconds"]
        try:
            max_seconds = float(raw)
        except ValueError:
            raise ReservationError(f"max_expected_seconds: {raw!r} is not a number") from None
        if not max_seconds >= 0:
            raise ReservationError(f"max_expected_seconds must be >= 0, got {raw}")
    return name, Reservation(min_band=min_band, max_expected_seconds=max_seconds)


def parse_reservations(texts: Sequence[str]) -> dict[str, Reservation]:
    reservations: dict[str, Reservation] = {}
    for text in texts:
        name, reservation = parse_reservation(text)
        if name in reservations:
            raise ReservationError(f"{name} is reserved twice; give its settings in one --reserve")
        reservations[name] = reservation
    return reservations


@dataclass(frozen=True)
class GpuView:
    """One GPU as a decision sees it."""

    index: int
    name: str
    resident: str | None
    busy: bool
    reservation: Reservation | None = None

    def admits(self, *, band: int, expected_seconds: float) -> bool:
        return self.reservation is None or self.reservation.admits(
            band=band, expected_seconds=expected_seconds
        )


@dataclass(frozen=True)
class ClusterView:
    """What a decision may know beyond its own GPU: the other GPUs, each
    member's running jobs, and each model's learned run time."""

    gpus: tuple[GpuView, ...]
    running_by_member: Mapping[int, int]
    learned_seconds: Mapping[str, float]

    def running(self, member_id: int) -> int:
        return self.running_by_member.get(member_id, 0)

    def expected_seconds(self, model: str) -> float:
        """The model's mean run so far; unknown (infinite) before its first end."""
        return self.learned_seconds.get(model, math.inf)

    def loaded_on_idle_gpus(self, *, besides: GpuView) -> frozenset[str]:
        """Models resident on the other GPUs that stand idle."""
        return frozenset(
            gpu.resident
            for gpu in self.gpus
            if gpu.index != besides.index and not gpu.busy and gpu.resident is not None
        )


class ClusterPolicy(Protocol):
    """Chooses a job for a GPU that is idle; told of each arrival and dispatch."""

    name: str

    def arrived(self, queued: QueuedJob, *, cluster: ClusterView) -> None:
        """`queued` was just submitted (a balancer assigns it here)."""
        ...

    def choose(
        self, queue: Sequence[QueuedJob], *, now: float, gpu: GpuView, cluster: ClusterView
    ) -> Choice | None:
        """The job `gpu` starts now, or None to stay idle until the next event."""
        ...

    def dispatched(self, chosen: QueuedJob, *, gpu: GpuView, at: float) -> None: ...


class SharedQueue:
    """A one-GPU policy in front of several GPUs: one queue, and each GPU that
    is idle takes the job the policy would choose for it."""

    def __init__(self, policy: SchedulingPolicy) -> None:
        self.policy = policy
        self.name = policy.name

    def arrived(self, queued: QueuedJob, *, cluster: ClusterView) -> None:
        return None

    def choose(
        self, queue: Sequence[QueuedJob], *, now: float, gpu: GpuView, cluster: ClusterView
    ) -> Choice | None:
        return self.policy.choose(queue, now=now, resident=gpu.resident) if queue else None

    def dispatched(self, chosen: QueuedJob, *, gpu: GpuView, at: float) -> None:
        self.policy.dispatched(chosen, at=at)


@dataclass
class _Gpu:
    spec: GpuSpec
    resident: str | None
    running: Dispatch | None = None


@dataclass
class _Learned:
    """Each model's finished runs, for the reservations' expected run time."""

    runs: Counter[str] = field(default_factory=Counter)
    total: dict[str, float] = field(default_factory=dict)
    mean: dict[str, float] = field(default_factory=dict)

    def finished(self, model: str, seconds: float) -> None:
        self.runs[model] += 1
        self.total[model] = self.total.get(model, 0.0) + seconds
        self.mean[model] = self.total[model] / self.runs[model]


def simulate_on_gpus(trace: Trace, policy: ClusterPolicy, gpus: Sequence[GpuSpec]) -> Run:
    """Replay `trace` on `gpus` (each starting with the trace's initial model)."""
    if not gpus:
        raise ValueError("at least one GPU")
    arrivals = Arrivals(trace)
    queue: list[QueuedJob] = []
    fleet = [_Gpu(spec, trace.initial_model) for spec in gpus]
    ends: list[tuple[float, int]] = []  # (end, GPU index)
    running_by_member: Counter[int] = Counter()
    learned = _Learned()
    run = Run(trace=trace, policy=policy.name, gpus=tuple(spec.name for spec in gpus))

    def view() -> ClusterView:
        return ClusterView(
            gpus=tuple(
                GpuView(
                    index=index,
                    name=gpu.spec.name,
                    resident=gpu.resident,
                    busy=gpu.running is not None,
                    reservation=gpu.spec.reservation,
                )
                for index, gpu in enumerate(fleet)
            ),
            running_by_member=running_by_member,
            learned_seconds=learned.mean,
        )

    now = trace.dispatch_from
    while True:
        while ends and ends[0][0] <= now:
            _, index = heapq.heappop(ends)
            done = fleet[index].running
            assert done is not None
            fleet[index].running = None
            running_by_member[done.job.member_id] -= 1
            learned.finished(done.job.model, done.job.job.seconds)
        for queued in arrivals.until(now):
            queue.append(queued)
            policy.arrived(queued, cluster=view())
        for index, gpu in enumerate(fleet):
            if gpu.running is not None or not queue:
                continue
            cluster = view()
            here = cluster.gpus[index]
            choice = policy.choose(queue, now=now, gpu=here, cluster=cluster)
            if choice is None:
                continue
            chosen = choice.job
            queue.remove(chosen)
            policy.dispatched(chosen, gpu=here, at=now)
            held = occupancy_seconds(
                resident=gpu.resident,
                model=chosen.model,
                seconds=chosen.job.seconds,
                swap_seconds=trace.swap_seconds,
            )
            dispatch = Dispatch(
                chosen,
                now,
                now + held,
                chosen.model != gpu.resident,
                choice.changed_by,
                gpu=gpu.spec.name,
                placed=choice.placed,
            )
            run.dispatches.append(dispatch)
            gpu.running = dispatch
            gpu.resident = chosen.model
            running_by_member[chosen.member_id] += 1
            heapq.heappush(ends, (dispatch.finished_at, index))
            arrivals.release_after(chosen.job, finished_at=dispatch.finished_at)
        next_times = ([arrivals.next_at] if arrivals else []) + ([ends[0][0]] if ends else [])
        if not next_times:
            break
        now = max(now, min(next_times))
    run.never_started = list(queue)
    return run
