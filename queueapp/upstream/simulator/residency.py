"""The simulated GPU when a llama-swap config is given: several models resident at once,
as its routing allows, and requests that wait instead of being refused.

`RoutedGpu` keeps `SimulatedGpu`'s log, events, in-flight list and answers, and replaces
its one resident model with a process state per model. Admission, under the GPU's lock,
follows llama-swap's FIFO scheduler (internal/router/scheduler/fifo.go):

1. ``concurrencyLimit``: a model with that many requests already admitted (waiting or in
   flight) refuses the next with a 429 and ``Retry-After: 1`` (``ConcurrencyLimitError``);
2. the requested model is stopping (an unload): the request waits for the stop to end;
3. the model is starting: the request joins its load, as a waiter of the swap under way;
4. otherwise the routing engine names the running models to stop (`routing.Router`). If
   one of them has requests in flight, the request waits (``conflictsWithInFlight``):
   a busy model is never stopped for a swap. Else they stop, and the model starts when
   it is not running, each load costing ``swap_seconds``.

A waiting request is woken whenever a request ends, a load ends or a stop ends, and
decides again from the top, as llama-swap's drainQueue walks its queue; so a request whose
model is ready goes ahead of one still waiting for a busy model to drain, as llama-swap's
fast path lets it. A request that finds its model's ``parallel`` slots taken waits too
(llama-server queues it). An unload of a model answers the requests waiting for it as
llama-swap's OnUnload does, with the load error (500).

Models running side by side share the GPU: a request's run is slowed by every request in
flight on it, whatever its model (`batched_seconds`), as with one model's parallel slots.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Collection
from dataclasses import replace
from typing import Any

from queueapp.policy.occupancy import batched_seconds
from queueapp.upstream.simulator.config import SwapConfig
from queueapp.upstream.simulator.events import EventType
from queueapp.upstream.simulator.gpu import (
    Admitted,
    Busy,
    ProcessConfig,
    ProcessState,
    SimulatedGpu,
    Unloading,
)

WAKE_S = 0.1  # how often a waiting request looks again even without a wake-up


class RoutedGpu(SimulatedGpu):
    """`SimulatedGpu` serving a llama-swap config's models with its routing."""

    def __init__(self, config: SwapConfig, **options: Any) -> None:
        self.config = config
        initial = options.pop("initial_model", None)
        super().__init__(**options)
        if initial is not None and initial not in self.models:
            raise ValueError(f"unknown initial model {initial!r}")
        for name, entry in config.models.items():
            self.processes[name] = replace(
                self.processes[name], name=entry.name or name, description=entry.description
            )
        self._wake = threading.Condition(self._lock)
        self._halted = False
        self._states: dict[str, ProcessState] = {}  # models not stopped
        self._load_ends: dict[str, float] = {}  # a starting model's end of load
        self._idle_since: dict[str, float] = {}  # for ttl: end of last request, or load
        self._model_of: dict[int, str] = {}  # log seq -> model, admitted or waiting
        self._unloads: dict[Unloading, tuple[str, ...]] = {}
        self._unload_count: Counter[str] = Counter()  # unloads begun, per model
        if initial is not None:
            self._states[initial] = ProcessState.READY
            self._idle_since[initial] = time.time()

    # -- what is served, and how it is shown -------------------------------------------------

    def real_model(self, requested: str) -> str:
        return self.config.real_model(requested) or requested

    def halt(self) -> None:
        """The server stops: waiting requests give up."""
        with self._wake:
            self._halted = True
            self._wake.notify_all()

    def running(self) -> dict[str, Any]:
        """``GET /running``: every model not stopped, by id (handleRunning)."""
        with self._lock:
            states = dict(self._states)
        out = []
        for model in sorted(states):
            process = self.processes.get(model, ProcessConfig())
            entry: dict[str, Any] = {"model": model, "state": states[model].value}
            entry.update(cmd=process.cmd)
            entry.update(proxy=process.proxy, ttl=process.ttl, name=process.name)
            out.append({**entry, "description": process.description})
        return {"running": out}

    def _model_status(self) -> list[dict[str, Any]]:
        statuses = []
        for name in sorted(self.processes):
            process = self.processes[name]
            state = self._states.get(name, ProcessState.STOPPED)
            record = {"id": name, "name": process.name, "description": process.description}
            statuses.append({**record, "state": state.value, "unlisted": False, "peerID": ""})
        return statuses

    def list_models(self) -> dict[str, Any]:
        listing = super().list_models()
        with self._lock:
            loaded = set(self._states)
        for record in listing["data"]:
            record["status"] = {"value": "loaded" if record["id"] in loaded else "unloaded"}
        return listing

    def _move(self, model: str, state: ProcessState) -> None:
        """Set ``model``'s process state and tell the event stream (lock held)."""
        if state is ProcessState.STOPPED:
            self._states.pop(model, None)
            self._load_ends.pop(model, None)
        else:
            self._states[model] = state
        if self.events.listening:
            self.events.publish(EventType.MODEL_STATUS, self._model_status())

    # -- admission ---------------------------------------------------------------------------

    def admit(self, entry: dict[str, Any], model: str, seconds: float) -> Admitted | Busy:
        """Admit the request, waiting as llama-swap's scheduler makes it wait; refused only
        over the model's ``concurrencyLimit`` (or when the server stops)."""
        seq = entry["seq"]
        with self._wake:
            admitted = Counter(self._model_of.values())  # waiting or in flight
            if admitted[model] >= self.config.models[model].concurrency_limit:
                return Busy(retry_after=1)  # llama-swap always says 1
            self._model_of[seq] = model
            unloads_seen = self._unload_count[model]
            while not self._halted:
                if self._unload_count[model] != unloads_seen:
                    # Unloaded while it waited: OnUnload's error to a queued request.
                    return self._admit_locked(entry, model, seconds, load=0.0, cut=True)
                outcome = self._try_admit(entry, model, seconds)
                if outcome is not None:
                    return outcome
                self._wake.wait(WAKE_S)
            self._model_of.pop(seq, None)
            return Busy(retry_after=1)

    def _try_admit(self, entry: dict[str, Any], model: str, seconds: float) -> Admitted | None:
        """One decision of the scheduler's tree; None: wait and decide again."""
        state = self._states.get(model)
        if state is ProcessState.STOPPING:
            return None
        if self._in_flight_on(model) >= self.parallel_for(model):
            return None
        now = time.time()
        if state is ProcessState.STARTING:
            return self._admit_locked(entry, model, seconds, load=self._load_ends[model] - now)
        running = sorted(self._states)
        evict = self.config.router.eviction_for(model, running)
        if any(self._in_flight_on(m) or self._states[m] is ProcessState.STOPPING for m in evict):
            return None
        for other in evict:
            self._move(other, ProcessState.STOPPING)
            self._move(other, ProcessState.STOPPED)
        entry["unloaded"] = sorted(evict)  # the log says what serving it unloaded
        if state is ProcessState.READY:
            return self._admit_locked(entry, model, seconds, load=0.0)
        self._move(model, ProcessState.STARTING)
        self._load_ends[model] = now + self.swap_seconds
        return self._admit_locked(entry, model, seconds, load=self.swap_seconds, swapped=True)

    def _in_flight_on(self, model: str) -> int:
        return sum(1 for seq in self._in_flight if self._model_of.get(seq) == model)

    def _admit_locked(
        self,
        entry: dict[str, Any],
        model: str,
        seconds: float,
        *,
        load: float,
        swapped: bool = False,
        cut: bool = False,
    ) -> Admitted:
        now = time.time()
        load = max(0.0, load)
        in_flight = len(self._in_flight) + 1  # every model's requests share the GPU
        run = batched_seconds(seconds, in_flight)
        admitted = Admitted(in_flight=in_flight, load_seconds=load, run_seconds=run)
        entry.update(started_at=now, swapped=swapped, in_flight=in_flight)
        entry.update(load_seconds=load, run_seconds=run)
        if cut:
            admitted.cut.set()
        else:
            self._in_flight[entry["seq"]] = now + load + run
            self._cuts[entry["seq"]] = admitted.cut
        return admitted

    def loaded(self, model: str) -> None:
        with self._wake:
            if self._states.get(model) is ProcessState.STARTING:
                self._idle_since[model] = time.time()
                self._move(model, ProcessState.READY)
                self._wake.notify_all()

    def close(self, entry: dict[str, Any], status: int, *, release: bool) -> None:
        with self._wake:
            model = self._model_of.pop(entry["seq"], None)
            if release and model is not None:
                self._idle_since[model] = time.time()
            self._wake.notify_all()
        super().close(entry, status, release=release)

    # -- unloads: by request, and by ttl -----------------------------------------------------

    def begin_unload(self, models: Collection[str] | None = None) -> Unloading | None:
        """Stop every running model of ``models`` (None: all) at once; requests in flight
        on them are cut, as llama-swap's Unload kills them."""
        with self._wake:
            targets = tuple(m for m in sorted(self._states) if models is None or m in models)
            targets = tuple(m for m in targets if self._states[m] is not ProcessState.STOPPING)
            if not targets:
                return None
            return self._begin_unload_of(targets)

    def begin_ttl_unload(self) -> Unloading | None:
        with self._wake:
            now = time.time()
            for model, state in sorted(self._states.items()):
                ttl = self.processes.get(model, ProcessConfig()).ttl
                if state is not ProcessState.READY or ttl <= 0 or self._in_flight_on(model):
                    continue
                if now - self._idle_since.get(model, now) > ttl:
                    return self._begin_unload_of((model,))
            return None

    def _begin_unload_of(self, targets: tuple[str, ...]) -> Unloading:
        unloading = Unloading(targets[0], time.time() + self.stop_seconds)
        self._unloads[unloading] = targets
        for model in targets:
            self._unload_count[model] += 1
            self._move(model, ProcessState.STOPPING)
        for seq in [s for s in self._in_flight if self._model_of.get(s) in targets]:
            self._cuts[seq].set()
            del self._in_flight[seq]  # the killed process frees the GPU at once
        self._wake.notify_all()
        return unloading

    def end_unload(self, unloading: Unloading) -> None:
        with self._wake:
            targets = self._unloads.pop(unloading, None)
            if targets is None:
                return
            for model in targets:
                if self._states.get(model) is ProcessState.STOPPING:
                    self._move(model, ProcessState.STOPPED)
            self._wake.notify_all()
