"""Several models on one GPU: who may start beside the jobs in flight.

llama-swap keeps a set of models loaded together, chosen by its routing
config (routing.py predicts what each request unloads). A GPU whose
routing is known (`ResidentSet`) runs jobs of several models at once, by
three rules that `decide` applies (decide.py):

- **Side by side.** A job starts beside the jobs in flight when its model
  is running, or loads without unloading a model that has jobs in flight.
  A model with a job in flight is never unloaded under it: llama-swap
  would hold the request until they end, and the job's clock would run.
- **Its own slots.** Each model runs at most `cap` jobs at once: its
  `parallel`, bounded by its `concurrencyLimit` (llama-swap answers 429
  past it). A job of a model at its cap waits for one of them to end; it
  holds up nobody else.
- **Drain.** A job whose load would unload a busy model waits for those
  jobs to end. Meanwhile only jobs that change nothing start beside: of a
  model already running, that unloads nothing and that the drained-for
  load keeps. Anything else could add to what the drain waits for.

Names: a job's model may be an alias; every set here holds model ids
(`routing.resolve`). A model the config does not name runs alone, as it
would in no set; llama-swap itself answers such a request with 404.

No Django here, as in the rest of the policy.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property, lru_cache

from queueapp.policy.concurrency import DEFAULT_CONCURRENCY_LIMIT, concurrency_limit
from queueapp.policy.routing import (
    RoutingConfig,
    RoutingConfigError,
    UnknownModel,
    evictions,
    resolve,
    routing_from_config,
)


class Room(enum.Enum):
    START = "start"  # it may start now
    OWN_SLOTS_FULL = "own_slots_full"  # its model runs as many jobs as it may
    UNLOADS_BUSY = "unloads_busy"  # its load would unload a model with jobs in flight


@dataclass(frozen=True)
class Swap:
    """What serving a job makes llama-swap do: the model it loads (None:
    running already) and the models it unloads."""

    loads: str | None
    unloads: frozenset[str]

    def as_json(self) -> dict[str, object]:
        return {"loads": self.loads, "unloads": sorted(self.unloads)}

    def sentence(self) -> str:
        """ "loading image-xl unloads tts-kokoro", for `why` and the logs."""
        unloads = ", ".join(sorted(self.unloads))
        if self.loads is None:
            return f"serving it unloads {unloads}"
        if not unloads:
            return f"loading {self.loads} unloads nothing"
        return f"loading {self.loads} unloads {unloads}"


def swap_from_json(value: object) -> Swap | None:
    """A recorded `Swap.as_json`, or None."""
    if not isinstance(value, Mapping):
        return None
    loads = value.get("loads")
    return Swap(
        loads=loads if isinstance(loads, str) else None,
        unloads=frozenset(str(model) for model in value.get("unloads") or ()),
    )


@lru_cache(maxsize=32)
def routing_of_text(text: str | None) -> RoutingConfig | None:
    """The routing of a GPU's recorded config parts (`routing.routing_parts`)
    as JSON text, built once per distinct text (a claim reads the column as
    text, so it parses nothing when the config did not change); None
    without one, or when it cannot be used (the dispatcher recorded why)."""
    if not text:
        return None
    try:
        parts = json.loads(text)
        return routing_from_config(parts) if isinstance(parts, Mapping) and parts else None
    except (RoutingConfigError, ValueError):
        return None


def routing_of_parts(parts: Mapping | None) -> RoutingConfig | None:
    """`routing_of_text` for the parts as a mapping (a row read by the ORM)."""
    return routing_of_text(json.dumps(parts, sort_keys=True)) if parts else None


@dataclass(frozen=True)
class ResidentSet:
    """A GPU as llama-swap runs it: its routing, the models it counts as
    running (ready or starting, and those gpusched has jobs in flight on),
    the jobs in flight per model and each model's `parallel`."""

    routing: RoutingConfig
    running_names: frozenset[str]
    in_flight: Mapping[str, int]  # by model name as the jobs carry it
    parallel: Mapping[str, int]  # by model name; a model not in it: 1
    # False: the GPU runs one model's jobs at a time all the same (its
    # `one_model_at_a_time`); the routing still predicts llama-swap's swaps.
    side_by_side: bool = True

    def model_id(self, name: str) -> str:
        """`name`'s model id; a name the config does not know stays itself."""
        try:
            return resolve(self.routing, name)
        except UnknownModel:
            return name

    @cached_property
    def running(self) -> frozenset[str]:
        return frozenset(self.model_id(name) for name in self.running_names)

    @cached_property
    def busy(self) -> Mapping[str, int]:
        """Jobs in flight per model id."""
        counts: dict[str, int] = {}
        for name, count in self.in_flight.items():
            if count > 0:
                model = self.model_id(name)
                counts[model] = counts.get(model, 0) + count
        return counts

    @cached_property
    def loaded_names(self) -> frozenset[str]:
        """Every name a job needs no load for: the running models and their
        aliases (swap affinity compares names)."""
        aliases = {alias for alias, model in self.routing.aliases.items() if model in self.running}
        return self.running | aliases

    def cap(self, name: str) -> int:
        """The most jobs of `name`'s model at once: its `parallel`, bounded
        by its `concurrencyLimit`."""
        model = self.model_id(name)
        parallel = max(1, self.parallel.get(name, self.parallel.get(model, 1)))
        limit = concurrency_limit(self.routing, model) or DEFAULT_CONCURRENCY_LIMIT
        return min(parallel, limit)

    def unloads(self, name: str) -> frozenset[str]:
        """The running models llama-swap unloads to serve `name`."""
        model = self.model_id(name)
        if model not in self.routing.models:
            return self.running - {model}  # in no set: it runs alone
        return evictions(self.routing, self.running, model)

    def swap(self, name: str) -> Swap | None:
        """What serving a job of `name` makes llama-swap do; None: nothing."""
        model = self.model_id(name)
        unloads = self.unloads(name)
        loads = None if model in self.running else model
        if loads is None and not unloads:
            return None
        return Swap(loads, unloads)

    def after_serving(self, name: str) -> frozenset[str]:
        """The names (model ids and aliases) running once a job of `name`
        is served: its load's unloads gone, its model in."""
        running = (self.running - self.unloads(name)) | {self.model_id(name)}
        aliases = {alias for alias, model in self.routing.aliases.items() if model in running}
        return running | aliases

    def room(self, name: str) -> Room:
        """Whether a job of `name` may start beside the jobs in flight."""
        if self.busy.get(self.model_id(name), 0) >= self.cap(name):
            return Room.OWN_SLOTS_FULL
        if self.unloads(name) & self.busy.keys():
            return Room.UNLOADS_BUSY
        return Room.START

    def starts_during_drain(self, name: str, *, drained_for: str) -> bool:
        """Whether a job of `name` may start while the GPU drains for a job
        of `drained_for`: it changes nothing (its model runs, it unloads
        nothing) and the drained-for load keeps its model."""
        return (
            self.room(name) is Room.START
            and self.swap(name) is None
            and self.model_id(name) not in self.unloads(drained_for)
        )

    def full(self) -> bool:
        """No job of any model the config names could start now: the claim
        need not read the queue."""
        return all(self.room(model) is not Room.START for model in self.routing.models)
