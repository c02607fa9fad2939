"""What a llama-swap runs, as its `GET /running` and its `GET /api/events` tell it.

llama-swap (v250) reports its processes two ways, and gpusched reads both:
- `GET /running` (internal/server/api.go, handleRunning) lists every
  process that is not stopped, each with its `model` and `state`
  (`starting`, `ready`, `stopping`);
- `GET /api/events` (internal/server/apigroup.go, handleAPIEvents) is an
  SSE stream. Every event is `event:message` whose `data` is an envelope
  `{"type": …, "data": "<a JSON string>"}`: the payload is encoded twice.
  `modelStatus` carries every configured model with its state (`stopped`
  included), sent on connect and on every change; `inflight` carries a
  `snapshot` of the requests in flight on connect, then an `upsert` of one
  request (`request`, with its `req_headers`) or a `remove` of one (`id`)
  (internal/server/inflight.go, internal/swaputil/events.go).
llama-swap drops messages when a client's send buffer is full, so the
stream alone is never trusted: `/running` is read again now and then
(queueapp/dispatch/upstream_watch.py) and replaces the model states.

A request gpusched forwards carries `X-Gpusched-Job-Id` (FORWARDED_JOB_HEADER);
one in flight without it came from another client: foreign load.

Plain Python, no Django: `LlamaSwapState` is shared by the thread that
follows the stream and the one that re-reads `/running`, behind a lock.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

# Sent on every request gpusched forwards: its job's id.
FORWARDED_JOB_HEADER = "X-Gpusched-Job-Id"

READY, STARTING, STOPPING, STOPPED = "ready", "starting", "stopping", "stopped"


@dataclass(frozen=True)
class ModelsRunning:
    """One reading of a llama-swap's models."""

    ready: tuple[str, ...]  # sorted
    loading: tuple[str, ...]  # `starting`, sorted
    # The model that became ready last: the one a single-model reader means.
    latest_ready: str | None
    foreign_in_flight: int


def resident_change(before: Iterable[str], after: Iterable[str]) -> str | None:
    """What loaded and what unloaded between two ready sets, in words
    ("loaded image-xl, unloaded tts-kokoro"); None when the set held."""
    was, now = set(before), set(after)
    parts = [
        f"{verb} {_listed(sorted(models))}"
        for verb, models in (("loaded", now - was), ("unloaded", was - now))
        if models
    ]
    return ", ".join(parts) or None


def _listed(names: list[str]) -> str:
    # "and" before the last: the comma already parts loads from unloads.
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def running_entries(answer: object) -> dict[str, str]:
    """`GET /running`'s answer as model → state; ValueError when it is not
    llama-swap's shape."""
    if not isinstance(answer, Mapping) or not isinstance(answer.get("running"), list):
        raise ValueError("GET /running did not answer {'running': [...]}")
    states: dict[str, str] = {}
    for entry in answer["running"]:
        if isinstance(entry, Mapping) and isinstance(entry.get("model"), str):
            states[entry["model"]] = str(entry.get("state", ""))
    return states


def server_sent_events(lines: Iterable[str]) -> Iterator[tuple[str, str]]:
    """(event, data) of each event of an SSE stream, read line by line (the
    WHATWG rules that llama-swap's `event:message\\ndata:…\\n\\n` needs: a
    field's value loses one leading space, data lines join with newlines)."""
    event, data = "message", list[str]()
    for line in lines:
        if line == "":
            if data:
                yield event, "\n".join(data)
            event, data = "message", list[str]()
            continue
        if line.startswith(":"):
            continue  # a comment: a keep-alive
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "event":
            event = value
        elif field == "data":
            data.append(value)


def event_payload(data: str) -> tuple[str, Any] | None:
    """(type, payload) of one `/api/events` message, its payload decoded the
    second time; None for a message that is not llama-swap's envelope."""
    try:
        envelope = json.loads(data)
        if not isinstance(envelope, dict) or not isinstance(envelope.get("type"), str):
            return None
        return envelope["type"], json.loads(envelope.get("data") or "null")
    except (ValueError, TypeError):
        return None


def is_forwarded_by_gpusched(headers: object) -> bool:
    """Whether a request in flight carries gpusched's job header (llama-swap
    sends header names in Go's canonical case; any case is accepted)."""
    if not isinstance(headers, Mapping):
        return False
    wanted = FORWARDED_JOB_HEADER.lower()
    return any(str(name).lower() == wanted for name in headers)


class LlamaSwapState:
    """The states of a llama-swap's models and its requests in flight, kept
    from `/running` readings and `/api/events` messages; each update says
    whether the reading changed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._states: dict[str, str] = {}
        self._ready_order: list[str] = []  # oldest first
        self._foreign: dict[str, bool] = {}  # request id -> came from elsewhere

    def reading(self) -> ModelsRunning:
        with self._lock:
            return self._reading()

    def running_read(self, states: Mapping[str, str]) -> bool:
        """`GET /running` answered `states` (model → state): it replaces what
        the events said, since they may have been dropped."""
        with self._lock:
            return self._set_states(states)

    def model_answered(self, model: str) -> bool:
        """A request of `model` was just answered: it is ready, and the latest
        (the others' states stand until the next reading says otherwise)."""
        with self._lock:
            before = self._reading()
            self._states[model] = READY
            self._ready_order = [m for m in self._ready_order if m != model] + [model]
            return self._reading() != before

    def event(self, kind: str, payload: Any) -> bool:
        """One `/api/events` message; the types other than `modelStatus` and
        `inflight` (logs, activity, the UI's) say nothing here."""
        with self._lock:
            before = self._reading()
            if kind == "modelStatus" and isinstance(payload, list):
                self._set_states(
                    {
                        entry["id"]: str(entry.get("state", ""))
                        for entry in payload
                        if isinstance(entry, Mapping)
                        and isinstance(entry.get("id"), str)
                        and not entry.get("peerID")  # another llama-swap's model
                    }
                )
            elif kind == "inflight" and isinstance(payload, Mapping):
                self._in_flight(payload)
            return self._reading() != before

    def stream_lost(self) -> bool:
        """The events stream ended: what it said of requests in flight is
        stale (a new connection's snapshot says it again)."""
        with self._lock:
            changed = any(self._foreign.values())
            self._foreign.clear()
            return changed

    def _set_states(self, states: Mapping[str, str]) -> bool:
        before = self._reading()
        self._states = {model: state for model, state in states.items() if state != STOPPED}
        ready = {model for model, state in self._states.items() if state == READY}
        self._ready_order = [model for model in self._ready_order if model in ready]
        self._ready_order += sorted(ready - set(self._ready_order))
        return self._reading() != before

    def _in_flight(self, update: Mapping[str, Any]) -> None:
        operation = update.get("operation")
        if operation == "snapshot":
            self._foreign = {
                str(entry.get("id")): not is_forwarded_by_gpusched(entry.get("req_headers"))
                for entry in update.get("requests") or []
                if isinstance(entry, Mapping)
            }
        elif operation == "upsert" and isinstance(update.get("request"), Mapping):
            entry = update["request"]
            self._foreign[str(entry.get("id"))] = not is_forwarded_by_gpusched(
                entry.get("req_headers")
            )
        elif operation == "remove":
            self._foreign.pop(str(update.get("id")), None)

    def _reading(self) -> ModelsRunning:
        ready = tuple(sorted(self._ready_order))
        loading = tuple(sorted(m for m, state in self._states.items() if state == STARTING))
        return ModelsRunning(
            ready=ready,
            loading=loading,
            latest_ready=self._ready_order[-1] if self._ready_order else None,
            foreign_in_flight=sum(self._foreign.values()),
        )
