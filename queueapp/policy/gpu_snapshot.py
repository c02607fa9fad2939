"""One GPU as a decision sees it (`GpuSnapshot`), and the other GPUs
(`PeerGpu`): what they have loaded, their slots, their reservation, and
the reasons a GPU itself keeps a job out (`Skip`). decide.py holds the
rules that read them. No Django here, as in the rest of the policy.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from queueapp.policy.resident_sets import ResidentSet, Room, Swap
from queueapp.policy.score import Candidate, Loaded, is_loaded, runs_short


class Skip(StrEnum):
    OVERDUE = "overdue"
    PINNED = "pinned"
    NOT_SERVED = "not_served"
    RESERVED = "reserved"
    RUNNING_LIMIT = "running_limit"


@dataclass(frozen=True)
class GpuSnapshot:
    """One GPU as a decision sees it."""

    name: str
    resident_model: str | None = None
    # Every model llama-swap has ready there (the resident one among them):
    # a job of any needs no load.
    resident_models: frozenset[str] = frozenset()
    # The models it may be given; None: any.
    runs_models: frozenset[str] | None = None
    # Its reservation: jobs of at least `min_band`, or of `short_models`
    # (those known to run under its expected-seconds bound; None: no such
    # bound). Neither set: no reservation.
    min_band: int | None = None
    short_models: frozenset[str] | None = None
    # That bound, for a job with an estimate of its own (`runs_short`).
    short_under: float | None = None
    # Its jobs in flight: the slots they hold, and their model (None when
    # two models share it after a setting changed under them: no slot for
    # either until all end).
    slots_taken: frozenset[int] = frozenset()
    in_flight_model: str | None = None
    # How many jobs of the model in flight it runs at once (its `parallel`).
    slots: int = 1
    enabled: bool = True
    # llama-swap's routing there, with what runs (resident_sets.py): it
    # predicts each job's swap, and jobs of several models share the GPU by
    # its rules unless the GPU runs `one_model_at_a_time` (`beside`). None:
    # no config, or one gpusched cannot use: one model's jobs at a time.
    sets: ResidentSet | None = None

    @property
    def beside(self) -> ResidentSet | None:
        """Its resident set when jobs of several models share it; None: one
        model's jobs at a time."""
        return self.sets if self.sets is not None and self.sets.side_by_side else None

    @property
    def reserved(self) -> bool:
        return self.min_band is not None or self.short_models is not None

    @property
    def idle(self) -> bool:
        return not self.slots_taken

    def peer(self) -> PeerGpu:
        """This GPU as another GPU's decision sees it."""
        return PeerGpu(
            name=self.name,
            resident_model=self.resident_model,
            resident_models=self.resident_models,
            idle=self.idle,
            reserved=self.reserved,
            claiming=self.enabled,
        )

    @property
    def affinity_model(self) -> str | None:
        """The model a job needs no swap for: the one in flight, else the resident one."""
        return self.in_flight_model if self.slots_taken else self.resident_model

    @property
    def loaded(self) -> Loaded:
        """What a job needs no load for: with resident sets, every model
        running there; otherwise the model in flight (its jobs alone may
        share the GPU), and on an idle GPU every model llama-swap has ready."""
        if self.beside is not None:
            return self.beside.loaded_names or None
        if self.slots_taken or not self.resident_models:
            return self.affinity_model
        if self.resident_model is None:
            return self.resident_models
        return self.resident_models | {self.resident_model}

    def free_slot(self) -> int | None:
        """The slot a new job may take; None when the GPU is full. An idle
        GPU's is slot 0, for a job of any model."""
        taken = self.slots_taken
        if taken and self.beside is not None:
            if self.beside.full():
                return None
        elif taken and (self.in_flight_model is None or len(taken) >= max(1, self.slots)):
            return None
        return min(set(range(len(taken) + 1)) - taken)

    def has_room_for(self, model: str) -> bool:
        """Whether a job of `model` could start here now by the GPU's own
        rules: it runs the model, and a slot is free beside jobs of that
        model only (the claim's and the front door's admission's rule)."""
        if self.runs_models is not None and model not in self.runs_models:
            return False
        if self.beside is not None:
            return self.idle or self.beside.room(model) is Room.START
        return self.free_slot() is not None and (self.idle or self.in_flight_model == model)

    def predicted_swap(self, model: str) -> Swap | None:
        """What serving a job of `model` here makes llama-swap load and
        unload; None: nothing. Without resident sets, llama-swap's default
        routing: every other running model is unloaded."""
        if self.sets is not None:
            return self.sets.swap(model)
        running = (
            self.resident_models
            | {self.resident_model or model}
            | ({self.in_flight_model} if self.in_flight_model else set())
        )
        loads = None if is_loaded(model, self.loaded) else model
        unloads = frozenset(running - {model})
        return Swap(loads, unloads) if loads or unloads else None

    def keeps_out(self, candidate: Candidate) -> Skip | None:
        """Whether the GPU itself keeps `candidate` out (its pin, served models,
        reservation)."""
        if candidate.pinned_gpu is not None and candidate.pinned_gpu != self.name:
            return Skip.PINNED
        if self.runs_models is not None and candidate.model not in self.runs_models:
            return Skip.NOT_SERVED
        if not self.reserved:
            return None
        if self.min_band is not None and candidate.band >= self.min_band:
            return None
        if self.short_models is not None and runs_short(
            candidate, self.short_under, self.short_models
        ):
            return None
        return Skip.RESERVED


@dataclass(frozen=True)
class PeerGpu:
    """Another GPU, as a decision here needs it: what it has loaded, whether
    it stands idle, whether a reservation may keep a job out of it, and
    whether it claims at all (enabled, reachable, its dispatcher alive)."""

    name: str
    resident_model: str | None = None
    resident_models: frozenset[str] = frozenset()
    idle: bool = True
    reserved: bool = False
    claiming: bool = True


def loaded_on_idle_gpus(others: Iterable[PeerGpu], *, besides: str) -> frozenset[str]:
    """Models resident on the other claiming GPUs that stand idle without a
    reservation (a reserved GPU might not take the job: it is not left to it)."""
    return frozenset(
        model
        for gpu in others
        if gpu.name != besides and gpu.claiming and gpu.idle and not gpu.reserved
        for model in (gpu.resident_models | {gpu.resident_model or ""})
        if model
    )
