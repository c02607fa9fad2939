"""The simulated GPU behind llama-swap: one resident model, a few slots for its requests.

All state the HTTP handler threads share lives here, behind one lock: the resident model
and its process state, the requests in flight and when each is planned to end, the requests
llama-swap would list as in flight (with their headers), the request log and what was
answered to each logged request. Every change of a process state or of the in-flight list
is published to the event stream under that lock, so events come in the order of the
changes. Admission is one decision under that lock:

* nothing in flight: admitted, with a swap when its model is not the resident one;
* requests in flight (all of the resident model, as a swap waits for an idle GPU), and this
  one is for that model with fewer than its ``parallel`` in flight: admitted beside them;
* the resident model is stopping (an unload): refused until its stop ends;
* anything else is refused with the seconds until the earliest in-flight request ends,
  which the server sends as ``Retry-After``.

Process states are llama-swap's (internal/process/process.go): a swap takes the old model
through ``stopping`` to ``stopped`` at once (its stop is part of the swap's cost) and the new
one through ``starting`` to ``ready``. An unload (``begin_unload``, then ``end_unload`` once
``stop_seconds`` have passed) holds the model in ``stopping`` for that time and cuts the
requests in flight on it at once, as llama-swap's Stop kills the upstream without waiting
for them (internal/router/base.go ``Unload``). A model's ``ttl`` unloads it once it has been
ready with nothing in flight for longer than that, counted from the end of its last request
(or from its load): process.go's ttl goroutine, which checks once a second, so llama-swap
unloads up to a second later than the simulator.

With ``parallel`` 1, the default, that is one request at a time: two requests that arrive
together can never both be admitted.

A request holds its slot for a cold load, then its run. The load is a whole swap when it
swapped (``queueapp.policy.occupancy_seconds``, the rule the policy simulator charges too),
or the rest of one still under way when it joins a model that is starting: it cannot compute
before the model is ready. The run is slowed by the requests sharing the GPU
(``queueapp.policy.occupancy.batched_seconds``), counted at its admission, itself included.
That is a simplification: a real batching server slows every request in flight as others
join and speeds them up as they leave. Fixing the time at admission keeps each request's
time known when it starts, so the log and ``Retry-After`` can say it.
"""

from __future__ import annotations

import hashlib
import math
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from queueapp.policy.occupancy import MAX_PARALLEL, batched_seconds, occupancy_seconds
from queueapp.upstream.simulator.events import EventHub, EventType, Subscription, connect_frames
from queueapp.upstream.simulator.inflight import (
    UPDATE_INTERVAL_S,
    InflightRequest,
    header_map,
    remove_event,
    snapshot_event,
    upsert_event,
)

SENT_KEPT = 64  # answers kept for sent(): bounded, as a long run serves many
FIRST_PORT = 5800  # llama-swap's default startPort, where ${PORT} begins


class ProcessState(StrEnum):
    """llama-swap's process states (internal/process/process.go), ``shutdown`` aside."""

    STOPPED = "stopped"
    STARTING = "starting"
    READY = "ready"
    STOPPING = "stopping"


@dataclass(frozen=True)
class ProcessConfig:
    """The config fields of a served model that ``/running`` and ``modelStatus`` show;
    a model served only through ``accept_any_model`` has none, so it shows Go's zero
    values, as an unconfigured id would in llama-swap."""

    cmd: str = ""
    proxy: str = ""
    ttl: int = 0  # llama-swap's ``ttl`` (UnloadAfter): idle seconds before an unload
    name: str = ""
    description: str = ""


@dataclass(frozen=True)
class Admitted:
    """The request holds a slot: it waits ``load_seconds`` for its model's cold load (its
    own swap, or the rest of one under way), then runs ``run_seconds``."""

    in_flight: int  # requests in flight at its admission, itself included
    load_seconds: float
    run_seconds: float
    # Set when an unload stops its model: its load or its run ends at once.
    cut: threading.Event = field(default_factory=threading.Event, compare=False)


@dataclass(frozen=True, eq=False)
class Unloading:
    """A stop under way: ``model`` is ``stopping`` until ``until`` (a ``time.time()``)."""

    model: str
    until: float

    def seconds_left(self) -> float:
        return max(0.0, self.until - time.time())


@dataclass(frozen=True)
class Busy:
    """The request is refused: no slot is free for its model."""

    retry_after: int  # whole seconds until the earliest in-flight request ends, at least 1


class SimulatedGpu:
    """The GPU's state and its request log; thread-safe."""

    def __init__(
        self,
        models: Mapping[str, float] | None = None,
        *,
        default_seconds: float = 1.0,
        accept_any_model: bool = False,
        swap_seconds: float = 1.0,
        initial_model: str | None = None,
        parallel: int = 1,
        parallel_models: Mapping[str, int] | None = None,
        ttl: Mapping[str, int] | None = None,
        stop_seconds: float = 0.0,
        events: EventHub | None = None,
        on_request: Callable[[dict[str, Any]], None] | None = None,
        size_scaled: bool | Collection[str] = False,
    ) -> None:
        self.models = {name: float(seconds) for name, seconds in (models or {}).items()}
        if min([default_seconds, swap_seconds, stop_seconds, *self.models.values()]) < 0:
            raise ValueError("durations must be >= 0")
        self.default_seconds = float(default_seconds)
        self.accept_any_model = accept_any_model
        self.swap_seconds = float(swap_seconds)
        self.stop_seconds = float(stop_seconds)
        self.events = events if events is not None else EventHub()
        self.on_request = on_request
        self.size_scaled = size_scaled if isinstance(size_scaled, bool) else frozenset(size_scaled)
        if initial_model is not None and self.seconds_for(initial_model) is None:
            raise ValueError(f"unknown initial model {initial_model!r}")
        self.parallel = parallel
        self.parallel_models = dict(parallel_models or {})
        for name, slots in [(None, parallel), *self.parallel_models.items()]:
            if isinstance(slots, bool) or not isinstance(slots, int):
                raise ValueError(f"parallel must be an integer, got {slots!r}")
            if not 1 <= slots <= MAX_PARALLEL:
                raise ValueError(f"parallel must be in [1, {MAX_PARALLEL}], got {slots}")
            if name is not None and self.seconds_for(name) is None:
                raise ValueError(f"parallel given for unknown model {name!r}")
        for name, seconds in (ttl or {}).items():
            if isinstance(seconds, bool) or not isinstance(seconds, int) or seconds < 0:
                raise ValueError(f"ttl must be an integer >= 0, got {seconds!r}")
            if name not in self.models:
                raise ValueError(f"ttl given for unconfigured model {name!r}")
        self.processes = {
            name: ProcessConfig(
                cmd=f"llama-server --port {port} --model {name}.gguf",
                proxy=f"http://127.0.0.1:{port}",
                ttl=(ttl or {}).get(name, 0),
                name=name,
                description="simulated by gpusched",
            )
            for port, name in enumerate(sorted(self.models), start=FIRST_PORT)
        }
        self._lock = threading.Lock()
        self._resident: str | None = initial_model
        self._resident_state = ProcessState.READY
        self._ready_at = 0.0  # when the resident model's cold load ends
        self._last_use = time.time()  # when its last request ended, or it became ready
        self._unloading: Unloading | None = None
        self._in_flight: dict[int, float] = {}  # log seq -> when it is planned to end
        self._cuts: dict[int, threading.Event] = {}  # log seq -> its Admitted.cut
        self._tracked: dict[int, InflightRequest] = {}  # log seq -> llama-swap's record
        self._log: list[dict[str, Any]] = []
        self._sent: dict[int, dict[str, Any]] = {}
        self._seq = 0
        self._answers = 0

    # -- what the GPU serves -----------------------------------------------------------------

    def seconds_for(self, model: str) -> float | None:
        """A request's run time for ``model`` alone on the GPU; None when it is not served."""
        if model in self.models:
            return self.models[model]
        return self.default_seconds if self.accept_any_model else None

    def scales_with_size(self, model: str) -> bool:
        """Whether ``model``'s run time follows the request's size (sizing.py)."""
        if isinstance(self.size_scaled, bool):
            return self.size_scaled
        return model in self.size_scaled

    def real_model(self, requested: str) -> str:
        """The model a request names: no aliases without a config (`RoutedGpu` has them)."""
        return requested

    def halt(self) -> None:
        """The server stops; nothing waits here (`RoutedGpu`'s waiting requests do)."""

    def parallel_for(self, model: str) -> int:
        """How many requests of ``model`` may be in flight at once."""
        return self.parallel_models.get(model, self.parallel)

    @property
    def uses_ttl(self) -> bool:
        return any(process.ttl > 0 for process in self.processes.values())

    def running(self) -> dict[str, Any]:
        """The body of ``GET /running``: every process that is not stopped, as llama-swap's
        handleRunning lists it (one at most here)."""
        with self._lock:
            resident, state = self._resident, self._resident_state
        if resident is None:
            return {"running": []}
        process = self.processes.get(resident, ProcessConfig())
        entry: dict[str, Any] = {"model": resident, "state": state.value, "cmd": process.cmd}
        entry.update(proxy=process.proxy, ttl=process.ttl, name=process.name)
        return {"running": [{**entry, "description": process.description}]}

    def _model_status(self) -> list[dict[str, Any]]:
        """``modelStatus``'s payload: every configured model with its state (apigroup.go)."""
        statuses = []
        for name in sorted(self.processes):
            process = self.processes[name]
            state = self._resident_state if name == self._resident else ProcessState.STOPPED
            record = {"id": name, "name": process.name, "description": process.description}
            statuses.append({**record, "state": state.value, "unlisted": False, "peerID": ""})
        return statuses

    def _set_state(self, model: str | None, state: ProcessState) -> None:
        """Move the resident process (None: no process) and tell the event stream."""
        self._resident = model
        self._resident_state = state
        if self.events.listening:
            self.events.publish(EventType.MODEL_STATUS, self._model_status())

    def subscribe_events(self) -> Subscription:
        """A new ``/api/events`` stream, given llama-swap's connect payload as of now."""
        with self._lock:
            now = time.time()
            payload = connect_frames(
                self._model_status(), snapshot_event(self._tracked.values(), now)
            )
            return self.events.subscribe(payload)

    def list_models(self) -> dict[str, Any]:
        """The body of ``GET /v1/models``: configured models only, as llama-swap lists them."""
        created = int(time.time())
        with self._lock:
            resident = self._resident
        data = []
        for name in sorted(self.models):
            record = {"id": name, "object": "model", "created": created, "owned_by": "llama-swap"}
            status = {"value": "loaded" if name == resident else "unloaded"}
            data.append({**record, "meta": {"llamaswap": {"type": "model"}}, "status": status})
        return {"object": "list", "data": data}

    # -- the request log ---------------------------------------------------------------------

    def log(self) -> list[dict[str, Any]]:
        """Handled model requests in arrival order (copies; in-flight ones have nulls)."""
        with self._lock:
            return [dict(entry) for entry in self._log]

    def reset_log(self) -> None:
        """Forget the log; the resident model, the requests in flight and the sequence
        counter are kept."""
        with self._lock:
            self._log.clear()
            self._sent.clear()

    def sent(self, seq: int) -> dict[str, Any] | None:
        """What was answered to log entry ``seq``: ``status``, ``content_type`` and ``body``
        (bytes; a stream's events without the chunk framing), each recorded before it is
        written, so a client that has read the answer finds it here. None once forgotten."""
        with self._lock:
            record = self._sent.get(seq)
            return None if record is None else {**record, "body": bytes(record["body"])}

    # -- one request's life (called from handler threads) ------------------------------------

    def open_entry(
        self, path: str, model: str, body: Any, received_at: float, *, raw: bytes = b""
    ) -> dict[str, Any]:
        """Log a model request as it arrives, before it is admitted or refused."""
        with self._lock:
            self._seq += 1
            entry = {"seq": self._seq, "path": path, "model": model or None}
            # What came over the wire, so a test can hold a proxy to byte-for-byte.
            entry.update(body_bytes=len(raw), body_sha256=hashlib.sha256(raw).hexdigest())
            entry.update(received_at=received_at, started_at=None, finished_at=None)
            entry.update(swapped=False, status=None, body=body)
            entry.update(in_flight=None, load_seconds=None, run_seconds=None)
            self._log.append(entry)
            return entry

    def admit(self, entry: dict[str, Any], model: str, seconds: float) -> Admitted | Busy:
        """Give the request a slot for a run of ``seconds`` alone, or refuse it."""
        with self._lock:
            now = time.time()
            if self._unloading is not None:
                return Busy(retry_after=max(1, math.ceil(self._unloading.until - now)))
            if self._in_flight and (
                self._resident != model or len(self._in_flight) >= self.parallel_for(model)
            ):
                return Busy(retry_after=max(1, math.ceil(min(self._in_flight.values()) - now)))
            in_flight = len(self._in_flight) + 1
            swapped = self._resident != model
            if swapped:
                # The cold load alone: the run is counted apart, slowed or not.
                load = occupancy_seconds(
                    resident=self._resident,
                    model=model,
                    seconds=0.0,
                    swap_seconds=self.swap_seconds,
                )
                if self._resident is not None:
                    self._set_state(self._resident, ProcessState.STOPPING)
                    self._set_state(None, ProcessState.STOPPED)
                self._set_state(model, ProcessState.STARTING)
                self._ready_at = now + load
            elif self._resident_state is ProcessState.STARTING:
                load = max(0.0, self._ready_at - now)
            else:
                load = 0.0
            run = batched_seconds(seconds, in_flight)
            self._in_flight[entry["seq"]] = now + load + run
            entry.update(started_at=now, swapped=swapped, in_flight=in_flight)
            entry.update(load_seconds=load, run_seconds=run)
            admitted = Admitted(in_flight=in_flight, load_seconds=load, run_seconds=run)
            self._cuts[entry["seq"]] = admitted.cut
            return admitted

    def loaded(self, model: str) -> None:
        """The cold load of ``model`` is over: its process is ready (unless an unload
        stopped it meanwhile)."""
        with self._lock:
            if self._resident == model and self._resident_state is ProcessState.STARTING:
                self._last_use = time.time()
                self._set_state(model, ProcessState.READY)

    # -- unloads: by request, and by ttl -----------------------------------------------------

    def begin_unload(self, models: Collection[str] | None = None) -> Unloading | None:
        """Start stopping the resident model if it is one of ``models`` (None: any): it is
        ``stopping`` from now, and the requests in flight on it are cut. The caller waits
        `Unloading.seconds_left`, then calls `end_unload`. None when there is nothing to
        stop; the stop under way when one already is."""
        with self._lock:
            if self._resident is None or (models is not None and self._resident not in models):
                return None
            return self._unloading or self._begin_unload_locked()

    def begin_ttl_unload(self) -> Unloading | None:
        """`begin_unload` of the resident model if its ttl has run out."""
        with self._lock:
            resident = self._resident
            if resident is None or self._resident_state is not ProcessState.READY:
                return None
            ttl = self.processes.get(resident, ProcessConfig()).ttl
            if ttl <= 0 or self._in_flight or time.time() - self._last_use <= ttl:
                return None
            return self._begin_unload_locked()

    def _begin_unload_locked(self) -> Unloading:
        assert self._resident is not None
        self._unloading = Unloading(self._resident, time.time() + self.stop_seconds)
        self._set_state(self._resident, ProcessState.STOPPING)
        for seq in self._in_flight:
            self._cuts[seq].set()
        self._in_flight.clear()  # the killed process frees the GPU at once
        return self._unloading

    def end_unload(self, unloading: Unloading) -> None:
        """The stop is over: the model is stopped (a second caller's end is a no-op)."""
        with self._lock:
            if self._unloading is unloading:
                self._unloading = None
                self._set_state(None, ProcessState.STOPPED)

    # -- llama-swap's in-flight list ---------------------------------------------------------

    def track(self, entry: dict[str, Any], request: InflightRequest) -> None:
        """List the request of log entry ``entry`` as in flight until it is closed."""
        with self._lock:
            self._tracked[entry["seq"]] = request
            if self.events.listening:
                self.events.publish(EventType.INFLIGHT, upsert_event(request, time.time()))

    def track_response_headers(self, seq: int, headers: Iterable[tuple[str, str]]) -> None:
        with self._lock:
            request = self._tracked.get(seq)
            if request is None:
                return
            now = time.time()
            request.fields["resp_headers"] = header_map(headers, request=False)
            request.last_emitted = now
            if self.events.listening:
                self.events.publish(EventType.INFLIGHT, upsert_event(request, now))

    def track_response_bytes(self, seq: int, count: int) -> None:
        with self._lock:
            request = self._tracked.get(seq)
            if request is None or count <= 0:
                return
            request.fields["resp_bytes"] += count
            now = time.time()
            if now - request.last_emitted >= UPDATE_INTERVAL_S:
                request.last_emitted = now
                if self.events.listening:
                    self.events.publish(EventType.INFLIGHT, upsert_event(request, now))

    def next_answer(self) -> int:
        """The number of the next answer, which makes its text and ids unique."""
        with self._lock:
            self._answers += 1
            return self._answers

    def record_sent(self, seq: int, **fields: Any) -> None:
        """Add to what was answered to log entry ``seq``: ``status``, ``content_type``, or
        ``body`` bytes (appended)."""
        with self._lock:
            record = self._sent.setdefault(
                seq, {"status": None, "content_type": None, "body": bytearray()}
            )
            record["body"].extend(fields.pop("body", b""))
            record.update(fields)
            while len(self._sent) > SENT_KEPT:
                del self._sent[next(iter(self._sent))]

    def close(self, entry: dict[str, Any], status: int, *, release: bool) -> None:
        """The request is over with ``status``; ``release`` frees its slot (an admitted
        request), and ``on_request`` is told."""
        with self._lock:
            seq = entry["seq"]
            entry["finished_at"], entry["status"] = time.time(), status
            if release:
                self._in_flight.pop(seq, None)
                self._cuts.pop(seq, None)
                self._last_use = entry["finished_at"]
            if self._tracked.pop(seq, None) is not None and self.events.listening:
                self.events.publish(EventType.INFLIGHT, remove_event(str(seq)))
            snapshot = dict(entry)
        if self.on_request is not None:
            self.on_request(snapshot)
