"""Following what a llama-swap runs while its dispatcher waits or forwards.

A model unloaded by its `ttl`, by the Unload button of llama-swap's UI or by
a crash must show on the GPU's row at once, not at the next claim. Two
threads beside a dispatcher's pass keep `GpuStateRecorder.state` current:
- one follows `GET /api/events` and records each change it brings (within
  milliseconds), reconnecting with a doubling backoff when the stream ends
  or cannot be opened;
- one reads `GET /running` every REREAD_SECONDS, since llama-swap drops
  events when a client's buffer is full: the reading replaces what the
  events said. While llama-swap is down or refuses the key it asks less
  and less often (the pass's own reads record that state).
Both are daemon threads that end within EVENTS_READ_TIMEOUT_SECONDS of the
pass's end (a blocked read cannot be interrupted; a silent stream is opened
again after that long anyway). They hold no database connection between
the writes of a change.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from functools import partial

import httpx
from django.db import connection

from queueapp.dispatch.gpu_state import GpuStateRecorder
from queueapp.errors import DATABASE_ERRORS
from queueapp.upstream.client import LlamaSwapClient, UpstreamUnreachable

logger = logging.getLogger(__name__)

# How often `/running` is read again whatever the events say: the bound on
# how stale the row is when events are lost.
REREAD_SECONDS = 3.0
# A stream silent this long is opened again (a fresh snapshot).
EVENTS_READ_TIMEOUT_SECONDS = 30.0
EVENTS_BACKOFF_FIRST_SECONDS = 0.5
EVENTS_BACKOFF_MAX_SECONDS = 30.0


class UpstreamWatch:
    """The two threads of one pass; `close` asks them to end."""

    def __init__(self, client_for: Callable[[], LlamaSwapClient], recorder: GpuStateRecorder):
        # Each thread has a client (an httpx client is not shared across threads).
        self._client_for = client_for
        self._recorder = recorder
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(self._follow_events,), daemon=True),
            threading.Thread(target=self._run, args=(self._reread_running,), daemon=True),
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def close(self) -> None:
        self._stop.set()

    def _run(self, body: Callable[[LlamaSwapClient], None]) -> None:
        client = self._client_for()
        try:
            body(client)
        finally:
            client.close()
            connection.close()

    def _follow_events(self, client: LlamaSwapClient) -> None:
        backoff = EVENTS_BACKOFF_FIRST_SECONDS
        while not self._stop.is_set():
            try:
                for kind, payload in client.events(read_timeout=EVENTS_READ_TIMEOUT_SECONDS):
                    if self._stop.is_set():
                        return
                    if self._recorder.state.event(kind, payload):
                        self._record(self._recorder.changed)
                    backoff = EVENTS_BACKOFF_FIRST_SECONDS  # the stream works
            except (UpstreamUnreachable, httpx.HTTPError) as exc:
                logger.debug("llama-swap's events: %s", exc)
            if self._recorder.state.stream_lost():
                self._record(self._recorder.changed)
            self._stop.wait(backoff)
            backoff = min(backoff * 2, EVENTS_BACKOFF_MAX_SECONDS)

    def _reread_running(self, client: LlamaSwapClient) -> None:
        pause = REREAD_SECONDS
        while not self._stop.wait(pause):
            try:
                states = client.running_states()
            except UpstreamUnreachable:
                # Down, or refusing the key: the pass's own reads record
                # that; this one asks less and less often meanwhile.
                pause = min(pause * 2, EVENTS_BACKOFF_MAX_SECONDS)
                continue
            pause = REREAD_SECONDS
            self._record(partial(self._recorder.running_read, states))

    def _record(self, write: Callable[[], object]) -> None:
        try:
            write()
        except DATABASE_ERRORS as exc:
            # The pass backs off on the same outage; the next change writes.
            logger.warning("could not record llama-swap's state: %s", exc)
            self._recorder.forget()
        finally:
            # Changes are rare: no connection is held between them (nor by a
            # thread still blocked in a read after its pass ended).
            connection.close()
