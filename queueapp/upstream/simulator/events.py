"""llama-swap's ``GET /api/events`` stream: its framing, its subscribers, and the switch
that drops its events.

Wire format, as ``handleAPIEvents`` (internal/server/apigroup.go) writes it: every event is
``event:message\\ndata:<envelope>\\n\\n`` (no space after either colon), the envelope is
``{"type":<type>,"data":<string>}`` and that string is itself JSON (the payload is encoded
twice). JSON is Go's: compact, fields in declaration order, map keys sorted, ``<``, ``>``
and ``&`` written as ``\\u003c``, ``\\u003e``, ``\\u0026``.

On connect llama-swap sends, in this order: ``logData`` (proxy history), ``logData``
(upstream history), ``modelStatus``, ``uiConfig``, ``profileChanged`` and an ``inflight``
snapshot; the simulator sends the same, with empty log histories, no UI settings and no
active profile. After that it sends ``modelStatus`` on every process state change and
``inflight`` upserts and removals. It never sends ``logData`` after connect, nor
``activity`` (llama-swap's metrics rows): the simulator has no process logs or metrics.

A subscriber's queue is bounded, like llama-swap's 1024-message send buffer: a reader that
falls that far behind loses the newest messages, not the server.

Simulator-only: the switch (``--no-events``, ``POST /sim/events``) imitates events that get
lost between llama-swap and a client. While it is off every event is dropped, the connect
payload included: a stream opened then answers 200 with its headers and stays open, silent,
and an open stream goes silent. Turned on again, streams carry the changes from then on; the
ones in between are lost. A client that must stay right re-reads ``GET /running``.
"""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Iterable
from enum import StrEnum
from typing import Any

SUBSCRIBER_BUFFER = 1024  # llama-swap's sendBuffer size

# handleAPIEvents' response headers; Transfer-Encoding is Go's, as it sends no length.
STREAM_HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "Connection": "keep-alive",
    "X-Content-Type-Options": "nosniff",
    "X-Accel-Buffering": "no",
}


class EventType(StrEnum):
    """llama-swap's message types (apigroup.go); the simulator sends all but ``activity``."""

    MODEL_STATUS = "modelStatus"
    LOG_DATA = "logData"
    ACTIVITY = "activity"
    INFLIGHT = "inflight"
    UI_CONFIG = "uiConfig"
    PROFILE_CHANGED = "profileChanged"


def go_json(value: Any) -> str:
    """``value`` as Go's encoding/json writes it (dicts keep their order: build structs
    in field order, and sort maps before)."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    # These only occur inside strings, where Go escapes them for HTML safety.
    for char, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026")):
        text = text.replace(char, escaped)
    return text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def frame(kind: EventType, payload: Any) -> bytes:
    """One event as it goes on the wire: the payload JSON-encoded inside the envelope."""
    envelope = go_json({"type": kind.value, "data": go_json(payload)})
    return b"event:message\ndata:" + envelope.encode() + b"\n\n"


def connect_frames(model_status: Any, inflight_snapshot: Any) -> list[bytes]:
    """What llama-swap sends a new stream before any change, in its order."""
    return [
        frame(EventType.LOG_DATA, {"source": "proxy", "data": ""}),
        frame(EventType.LOG_DATA, {"source": "upstream", "data": ""}),
        frame(EventType.MODEL_STATUS, model_status),
        frame(EventType.UI_CONFIG, {"activity": {"session_id": None}}),
        frame(EventType.PROFILE_CHANGED, {"active": None}),
        frame(EventType.INFLIGHT, inflight_snapshot),
    ]


class Subscription:
    """One open ``/api/events`` stream's pending frames."""

    def __init__(self) -> None:
        self.frames: queue.Queue[bytes] = queue.Queue(maxsize=SUBSCRIBER_BUFFER)

    def offer(self, data: bytes) -> None:
        try:
            self.frames.put_nowait(data)
        except queue.Full:
            pass  # as llama-swap: a reader this far behind loses the message

    def next_frame(self, timeout: float) -> bytes | None:
        try:
            return self.frames.get(timeout=timeout)
        except queue.Empty:
            return None


class EventHub:
    """The open streams and the switch; thread-safe, and a leaf: it calls nothing back, so
    the GPU may publish while it holds its own lock (which keeps events in state order)."""

    def __init__(self, *, enabled: bool = True) -> None:
        self._lock = threading.Lock()
        self._subscribers: set[Subscription] = set()
        self._enabled = enabled

    @property
    def enabled(self) -> bool:
        with self._lock:
            return self._enabled

    def set_enabled(self, enabled: bool) -> None:
        with self._lock:
            self._enabled = enabled

    @property
    def listening(self) -> bool:
        """Whether a published event would reach anyone (so building it is worth it)."""
        with self._lock:
            return self._enabled and bool(self._subscribers)

    def subscribe(self, initial: Iterable[bytes]) -> Subscription:
        """A new stream, given ``initial`` first unless events are off."""
        subscription = Subscription()
        with self._lock:
            if self._enabled:
                for data in initial:
                    subscription.offer(data)
            self._subscribers.add(subscription)
        return subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        with self._lock:
            self._subscribers.discard(subscription)

    def publish(self, kind: EventType, payload: Any) -> None:
        """Send one event to every open stream; dropped while events are off."""
        with self._lock:
            if not self._enabled or not self._subscribers:
                return
            data = frame(kind, payload)
            for subscription in self._subscribers:
                subscription.offer(data)
