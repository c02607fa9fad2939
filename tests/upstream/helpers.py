"""What the simulator's tests over real HTTP share: an event stream reader, a request in
the background, a chat body."""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx

from gpusched.stack import wait_for

DEADLINE_S = 5.0


def chat(model: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hello"}], **extra}


def in_background(call: Callable[[], httpx.Response]) -> Callable[[], httpx.Response]:
    """Run ``call`` in a thread; the returned function waits for its response."""
    done: list[httpx.Response] = []
    thread = threading.Thread(target=lambda: done.append(call()), daemon=True)
    thread.start()

    def result() -> httpx.Response:
        thread.join(timeout=DEADLINE_S)
        assert done, "the request did not finish"
        return done[0]

    return result


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


def wait_until(check: Callable[[], bool], what: str, deadline_s: float = DEADLINE_S) -> None:
    """Poll ``check`` until it holds (the project's one wait with a deadline,
    gpusched.stack.wait_for); fail naming ``what`` after ``deadline_s``."""
    try:
        wait_for(check, timeout=deadline_s, message=what, interval=0.01)
    except TimeoutError as exc:
        raise AssertionError(str(exc)) from exc
