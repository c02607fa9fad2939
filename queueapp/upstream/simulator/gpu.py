"""The simulated GPU behind llama-swap: one resident model, one request at a time.

All state the HTTP handler threads share lives here, behind one lock: the resident model
and its process state, when the running job frees the GPU, the request log and what was
answered to each logged request. Admission is one decision under that lock, so two
requests that arrive together can never both be admitted: the second is refused with the
seconds the first still holds the GPU for, which the server sends as ``Retry-After``.

A job holds the GPU for its run plus one cold load when its model is not the resident one
(``queueapp.policy.occupancy_seconds``, the rule the policy simulator charges too).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from queueapp.policy.occupancy import occupancy_seconds

SENT_KEPT = 64  # answers kept for sent(): bounded, as a long run serves many


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
        self._lock = threading.Lock()
        self._resident: str | None = initial_model
        self._resident_state = "ready"
        self._busy_until: float | None = None
        self._log: list[dict[str, Any]] = []
        self._sent: dict[int, dict[str, Any]] = {}
        self._seq = 0
        self._answers = 0

    # -- what the GPU serves -----------------------------------------------------------------

    def seconds_for(self, model: str) -> float | None:
        """A request's run time for ``model``; None when the model is not served."""
        if model in self.models:
            return self.models[model]
        return self.default_seconds if self.accept_any_model else None

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
        """Forget the log; the resident model and the sequence counter are kept."""
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

    def open_entry(self, path: str, model: str, body: Any, received_at: float) -> dict[str, Any]:
        """Log a model request as it arrives, before it is admitted or refused."""
        with self._lock:
            self._seq += 1
            entry = {"seq": self._seq, "path": path, "model": model or None}
            entry.update(received_at=received_at, started_at=None, finished_at=None)
            entry.update(swapped=False, status=None, body=body)
            self._log.append(entry)
            return entry

    def admit(self, entry: dict[str, Any], model: str, seconds: float) -> int:
        """Claim the GPU; returns 0 when admitted, else the Retry-After seconds."""
        with self._lock:
            now = time.time()
            if self._busy_until is not None:
                return max(1, math.ceil(self._busy_until - now))
            swapped = self._resident != model
            self._busy_until = now + occupancy_seconds(
                resident=self._resident,
                model=model,
                seconds=seconds,
                swap_seconds=self.swap_seconds,
            )
            if swapped:
                self._resident, self._resident_state = model, "starting"
            entry["started_at"], entry["swapped"] = now, swapped
            return 0

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
        """The request is over with ``status``; ``release`` frees the GPU (an admitted
        request), and ``on_request`` is told."""
        with self._lock:
            entry["finished_at"], entry["status"] = time.time(), status
            if release:
                self._busy_until = None
            snapshot = dict(entry)
        if self.on_request is not None:
            self.on_request(snapshot)
