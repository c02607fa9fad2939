"""Simulators started over real HTTP for the tests here, stopped after each."""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from queueapp.upstream.simulator import LlamaSwapSimulator

DEADLINE_S = 5.0


@pytest.fixture
def make_sim() -> Iterator[Callable[..., LlamaSwapSimulator]]:
    started: list[LlamaSwapSimulator] = []

    def factory(**kwargs: Any) -> LlamaSwapSimulator:
        kwargs.setdefault("models", {"chat": 0.05, "image": 0.05})
        kwargs.setdefault("swap_seconds", 0.1)
        sim = LlamaSwapSimulator("127.0.0.1", 0, **kwargs).start()
        started.append(sim)
        return sim

    yield factory
    for sim in started:
        sim.stop()


class EventStream:
    """One ``GET /api/events`` stream read over real HTTP by a background thread: each
    frame as it came over the wire, and its decoded envelope (``data`` decoded too)."""

    def __init__(self, url: str) -> None:
        self._client = httpx.Client(timeout=httpx.Timeout(10, read=None))
        self._frames: queue.Queue[tuple[bytes, dict[str, Any]] | None] = queue.Queue()
        self._connected = threading.Event()
        self.response: httpx.Response | None = None
        self._thread = threading.Thread(target=self._read, args=(url,), daemon=True)
        self._thread.start()
        if not self._connected.wait(DEADLINE_S):
            raise AssertionError("the event stream did not answer")

    def _read(self, url: str) -> None:
        try:
            with self._client.stream("GET", f"{url}/api/events") as response:
                self.response = response
                self._connected.set()
                pending = b""
                for chunk in response.iter_raw():
                    pending += chunk
                    while b"\n\n" in pending:
                        raw, pending = pending.split(b"\n\n", 1)
                        self._frames.put((raw + b"\n\n", decode_frame(raw + b"\n\n")))
        except httpx.HTTPError:
            pass  # closed by the test
        finally:
            self._connected.set()
            self._frames.put(None)

    def next(self, deadline_s: float = DEADLINE_S) -> tuple[bytes, dict[str, Any]]:
        """The next frame and its decoded envelope; fails after ``deadline_s`` without one."""
        try:
            item = self._frames.get(timeout=deadline_s)
        except queue.Empty:
            raise AssertionError(f"no event within {deadline_s} s") from None
        if item is None:
            raise AssertionError("the event stream ended")
        return item

    def until(
        self, matches: Callable[[dict[str, Any]], bool], deadline_s: float = DEADLINE_S
    ) -> list[dict[str, Any]]:
        """Decoded events up to and including the first that ``matches``."""
        seen: list[dict[str, Any]] = []
        end = time.monotonic() + deadline_s
        while True:
            _, event = self.next(max(0.0, end - time.monotonic()))
            seen.append(event)
            if matches(event):
                return seen

    def close(self) -> None:
        # The reader may stay blocked until the simulator stops and ends the stream.
        self._client.close()


def decode_frame(raw: bytes) -> dict[str, Any]:
    """An ``event:message`` frame's envelope, its JSON-string ``data`` decoded."""
    head, sep, body = raw.partition(b"\ndata:")
    assert head == b"event:message" and sep and body.endswith(b"\n\n"), raw
    envelope = json.loads(body)
    assert set(envelope) == {"type", "data"} and isinstance(envelope["data"], str), envelope
    return {"type": envelope["type"], "data": json.loads(envelope["data"])}


@pytest.fixture
def open_events() -> Iterator[Callable[[LlamaSwapSimulator], EventStream]]:
    opened: list[EventStream] = []

    def factory(sim: LlamaSwapSimulator) -> EventStream:
        stream = EventStream(sim.url)
        opened.append(stream)
        return stream

    yield factory
    for stream in opened:
        stream.close()
