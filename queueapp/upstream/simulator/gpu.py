"""The simulated GPU behind llama-swap: one resident model, a few slots for its requests.

All state the HTTP handler threads share lives here, behind one lock: the resident model
and its process state, the requests in flight and when each is planned to end, the request
log and what was answered to each logged request. Admission is one decision under that lock:

* nothing in flight: admitted, with a swap when its model is not the resident one;
* requests in flight (all of the resident model, as a swap waits for an idle GPU), and this
  one is for that model with fewer than its ``parallel`` in flight: admitted beside them;
* anything else is refused with the seconds until the earliest in-flight request ends,
  which the server sends as ``Retry-After``.

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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from queueapp.policy.occupancy import MAX_PARALLEL, batched_seconds, occupancy_seconds

SENT_KEPT = 64  # answers kept for sent(): bounded, as a long run serves many


@dataclass(frozen=True)
class Admitted:
    """The request holds a slot: it waits ``load_seconds`` for its model's cold load (its
    own swap, or the rest of one under way), then runs ``run_seconds``."""

    in_flight: int  # requests in flight at its admission, itself included
    load_seconds: float
    run_seconds: float


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
        on_request: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.models = {name: float(seconds) for name, seconds in (models or {}).items()}
        if min([default_seconds, swap_seconds, *self.models.values()]) < 0:
            raise ValueError("durations must be >= 0")
        self.default_seconds = float(default_seconds)
        self.accept_any_model = accept_any_model
        self.swap_seconds = float(swap_seconds)
        self.on_request = on_request
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
        self._lock = threading.Lock()
        self._resident: str | None = initial_model
        self._resident_state = "ready"
        self._ready_at = 0.0  # when the resident model's cold load ends
        self._in_flight: dict[int, float] = {}  # log seq -> when it is planned to end
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

    def parallel_for(self, model: str) -> int:
        """How many requests of ``model`` may be in flight at once."""
        return self.parallel_models.get(model, self.parallel)

    def running(self) -> dict[str, Any]:
        """The body of ``GET /running``."""
        with self._lock:
            resident, state = self._resident, self._resident_state
        if resident is None:
            return {"running": []}
        entry = {"model": resident, "state": state, "cmd": "", "proxy": "", "ttl": 0}
        return {"running": [{**entry, "name": "", "description": ""}]}

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
                self._resident, self._resident_state = model, "starting"
                self._ready_at = now + load
            else:
                load = max(0.0, self._ready_at - now) if self._resident_state == "starting" else 0.0
            run = batched_seconds(seconds, in_flight)
            self._in_flight[entry["seq"]] = now + load + run
            entry.update(started_at=now, swapped=swapped, in_flight=in_flight)
            entry.update(load_seconds=load, run_seconds=run)
            return Admitted(in_flight=in_flight, load_seconds=load, run_seconds=run)

    def loaded(self, model: str) -> None:
        """The cold load of ``model`` is over: its process is ready."""
        with self._lock:
            if self._resident == model:
                self._resident_state = "ready"

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
            entry["finished_at"], entry["status"] = time.time(), status
            if release:
                self._in_flight.pop(entry["seq"], None)
            snapshot = dict(entry)
        if self.on_request is not None:
            self.on_request(snapshot)
