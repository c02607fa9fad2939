"""The forecast's GPUs: each as the play starts (`ForecastGpu`, its jobs in
flight `InFlight`), and each during the play (`Timeline`): when it frees,
what it has loaded, its jobs in flight, and when it picks next. forecast.py
plays the queue over them. No Django here, as in the rest of the policy.
"""

from __future__ import annotations

import math
from bisect import insort
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from queueapp.policy.decide import GpuSnapshot, PeerGpu
from queueapp.policy.resident_sets import ResidentSet
from queueapp.policy.routing import RoutingConfig


@dataclass(frozen=True)
class InFlight:
    """A job running on a GPU as the play starts: its model, when it should end."""

    model: str
    ends_at: float  # unix seconds


@dataclass(frozen=True)
class ForecastGpu:
    """One GPU as the play starts: when it frees, what it has loaded, which
    models it runs (None: any).

    `in_flight`, when given, are its running jobs, and `free_at` (when it
    frees) is the last one's end: the play reads the jobs. `parallel`: per
    model, how many of its jobs the GPU runs at once (a model not in it: 1).
    """

    name: str
    free_at: float
    resident_model: str | None
    runs_models: frozenset[str] | None = None
    # Every model llama-swap has ready there (the resident one among them).
    resident_models: frozenset[str] = frozenset()
    # Its reservation (queueapp/policy/placement.py): jobs of at least
    # `min_band`, or of the models known to run short; None: no reservation.
    min_band: int | None = None
    short_models: frozenset[str] | None = None
    short_under: float | None = None  # the reservation's bound (GpuSnapshot.short_under)
    in_flight: tuple[InFlight, ...] = ()
    parallel: Mapping[str, int] = field(default_factory=dict, hash=False)
    # llama-swap's routing there: jobs of co-resident models share it
    # (resident_sets.py); None: one model's jobs at a time.
    routing: RoutingConfig | None = field(default=None, hash=False)

    def slots(self, model: str) -> int:
        """How many jobs of `model` it runs at once."""
        return max(1, self.parallel.get(model, 1))


class Timeline:
    """One GPU during the play: its resident model, the ends of its jobs in
    flight (all of one model, `sharing`), and when it picks next."""

    __slots__ = ("gpu", "resident", "loaded", "ends", "flight", "sharing", "next_at", "waiting")

    def __init__(self, gpu: ForecastGpu, *, now: float) -> None:
        self.gpu = gpu
        self.waiting = False
        self.ends = sorted(job.ends_at for job in gpu.in_flight)
        # With resident sets: each job in flight's end and model, by end.
        self.flight = sorted((job.ends_at, job.model) for job in gpu.in_flight)
        models = {job.model for job in gpu.in_flight}
        # Jobs of two models at once (a setting changed under them): no
        # slot for either until all have ended.
        self.sharing: str | None = models.pop() if len(models) == 1 else None
        self.resident = self.sharing or gpu.resident_model
        self.loaded = gpu.resident_models
        self.next_at = gpu.free_at if not gpu.in_flight else self._next_pick(now)

    def _next_pick(self, clock: float) -> float:
        if not self.ends:
            return clock
        if self.gpu.routing is not None:
            sets = self._sets(clock)
            return clock if sets is None or not sets.full() else self.ends[0]
        if self.sharing is None:
            return self.ends[-1]
        return clock if len(self.ends) < self.gpu.slots(self.sharing) else self.ends[0]

    def waits_at(self, clock: float) -> float | None:
        """Drops the jobs ended by `clock`; when the ones still in flight
        leave no slot, the moment one does (a later pick), else None."""
        while self.ends and self.ends[0] <= clock:
            self.ends.pop(0)
        while self.flight and self.flight[0][0] <= clock:
            self.flight.pop(0)
        if not self.ends:
            self.sharing = None
        pick = self._next_pick(clock)
        return pick if pick > clock else None

    def view(self, clock: float) -> GpuSnapshot:
        """The GPU at `clock` as `decide` reads it, when it picks (its
        `free_at` passed: the play picks on a GPU only from then)."""
        in_flight = sum(1 for end in self.ends if end > clock)
        sharing = self.sharing
        gpu = self.gpu
        return GpuSnapshot(
            name=gpu.name,
            resident_model=self.resident,
            resident_models=self.loaded,
            runs_models=gpu.runs_models,
            min_band=gpu.min_band,
            short_models=gpu.short_models,
            short_under=gpu.short_under,
            slots_taken=frozenset(range(in_flight)),
            in_flight_model=sharing if in_flight else None,
            slots=gpu.slots(sharing) if sharing else 1,
            sets=self._sets(clock),
        )

    def loads(self, model: str, clock: float) -> bool:
        """Whether a job of `model` starting at `clock` pays a load: with
        resident sets, when its routing predicts one."""
        sets = self._sets(clock)
        if sets is not None:
            swap = sets.swap(model)
            return swap is not None and swap.loads is not None
        return model != self.resident and model not in self.loaded

    def _sets(self, clock: float) -> ResidentSet | None:
        """The GPU's resident set at `clock` (None without a routing)."""
        routing = self.gpu.routing
        if routing is None:
            return None
        models = [model for end, model in self.flight if end > clock]
        running = self.loaded | set(models) | ({self.resident} if self.resident else set())
        return ResidentSet(
            routing=routing,
            running_names=frozenset(running),
            in_flight=Counter(models),
            parallel=self.gpu.parallel,
        )

    def peer(self, clock: float) -> PeerGpu:
        """The GPU at `clock` as another GPU's decision sees it: busy while
        a job of its is in flight, or until `free_at` when its jobs are not
        known."""
        gpu = self.gpu
        busy = any(end > clock for end in self.ends) or (not gpu.in_flight and gpu.free_at > clock)
        return PeerGpu(
            name=gpu.name,
            resident_model=self.resident,
            resident_models=self.loaded,
            idle=not busy,
            reserved=gpu.min_band is not None or gpu.short_models is not None,
        )

    def drain(self) -> None:
        """Another model won a slot: nothing more starts until the last job
        in flight ends, unless the queue changes first (`wake`). With
        resident sets, the pick is made again as each job ends."""
        self.wait_for_change(until=self.ends[0] if self.gpu.routing else self.ends[-1])

    def wait_for_change(self, *, until: float | None) -> None:
        """Decide again when the queue changes, or at `until` (None: only then)."""
        self.next_at = math.inf if until is None else until
        self.waiting = True

    def wake(self, clock: float) -> None:
        """The queue changed (another GPU started a job, a head expired): a
        GPU waiting for it decides again, as the claim decides afresh."""
        if self.waiting:
            self.waiting = False
            self.next_at = min(self.next_at, clock)

    def start(self, model: str, *, clock: float, seconds: float) -> None:
        sets = self._sets(clock)
        insort(self.ends, clock + seconds)
        insort(self.flight, (clock + seconds, model))
        self.sharing = model
        if sets is not None:
            # Only the loads and unloads its routing predicts.
            self.loaded = sets.after_serving(model)
        elif model not in self.loaded:
            # A load: which of the others llama-swap keeps is its routing's
            # to say; the play keeps only this one.
            self.loaded = frozenset()
        self.resident = model
        self.waiting = False
        self.next_at = self._next_pick(clock)
