"""`python -m gpusched.serve`: Daphne, with a stop that lets requests finish.

Daphne's own stop (SIGTERM, SIGINT) ends the reactor at once and cancels
every request in progress: a front-door call relayed by this web server, or
a caller waiting for its job, would lose its answer at each restart. Here a
stop signal instead:

1. closes the listening sockets, so new connections go to another web
   server (nginx passes a refused connection to the next one) or are
   refused; the connections the kernel has already accepted are taken
   first, so that none is reset with its request in it;
2. answers every request from then on with `Connection: close`, on the
   connections kept open (keep-alive) too, and closes each after its answer;
3. waits until every HTTP request in progress has ended, then until each
   kept connection still open has been idle for IDLE_CLOSE_SECONDS, in all
   at most GPUSCHED_STOP_SECONDS (the dispatchers' own grace);
4. closes those idle connections itself, then stops as Daphne does: the
   WebSockets (the dashboard, which reconnects) and anything still running
   are closed.

Why 2 and 4: Daphne's own stop closes a kept connection while the reactor
winds down, and a request the client sent on it meanwhile is reset unread.
nginx retries no POST it has sent, so that request would fail. A client
told `Connection: close` opens a new connection instead, which is refused
and goes to the other web server; a connection idle for a while is closed
while the reactor is idle, where the client sees the close before it
reuses it.

A second signal during the wait stops at once. The arguments are Daphne's
own (`daphne --help`); `daphne_command` (gpusched/server_limits.py) gives the
ones `make run`, the tests and the service units use.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
import weakref
from typing import Any

from daphne.cli import CommandLineInterface
from daphne.http_protocol import WebRequest
from daphne.server import Server
from twisted.internet import reactor, task
from twisted.web.http import HTTPChannel

logger = logging.getLogger("gpusched.serve")

DEFAULT_STOP_SECONDS = 60.0
# How often the drain looks for requests still in progress.
DRAIN_POLL_SECONDS = 0.1
# How long a kept connection must have been idle before the stop closes it:
# longer than a busy client's pause between two requests on it.
IDLE_CLOSE_SECONDS = 0.5


def _stop_seconds() -> float:
    """GPUSCHED_STOP_SECONDS, read as the settings read it (their default)."""
    try:
        return float(os.environ.get("GPUSCHED_STOP_SECONDS") or DEFAULT_STOP_SECONDS)
    except ValueError:
        return DEFAULT_STOP_SECONDS


def _answer_closes(request: Any) -> None:
    """The answer to `request` tells the client that its connection closes."""
    request.responseHeaders.setRawHeaders(b"Connection", [b"close"])


class DrainingServer(Server):
    """Daphne's server with the stop described above."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["signal_handlers"] = False  # ours, installed once the reactor runs
        super().__init__(*args, **kwargs)
        self.ports: list[Any] = []
        self.draining_since: float | None = None
        # Every HTTP connection's channel, and since when each has been idle.
        self.channels: weakref.WeakSet[HTTPChannel] = weakref.WeakSet()
        self.idle_since: weakref.WeakKeyDictionary[HTTPChannel, float] = weakref.WeakKeyDictionary()

    def run(self) -> None:
        reactor.callWhenRunning(self._install_stop_signals)
        reactor.callWhenRunning(self._track_channels)
        super().run()

    def _track_channels(self) -> None:
        """Record each connection's channel and make it close after its
        answer once the stop has begun. Installed before the reactor accepts
        its first connection."""
        build_protocol = self.http_factory.buildProtocol

        def build_tracked_protocol(addr: Any) -> Any:
            protocol = build_protocol(addr)
            channel = getattr(protocol, "_channel", None)
            if isinstance(channel, HTTPChannel):
                self.channels.add(channel)
                keeps_open = channel.checkPersistence

                def check_persistence(request: Any, version: bytes) -> bool:
                    if self.draining_since is None:
                        return keeps_open(request, version)
                    _answer_closes(request)
                    return False

                channel.checkPersistence = check_persistence  # type: ignore[method-assign]
            return protocol

        self.http_factory.buildProtocol = build_tracked_protocol

    def listen_success(self, port: Any) -> None:
        self.ports.append(port)  # kept to close at the stop
        super().listen_success(port)

    def _install_stop_signals(self) -> None:
        def on_signal(signum: int, frame: object) -> None:
            reactor.callFromThread(self._stop_requested)

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)

    def _stop_requested(self) -> None:
        if self.draining_since is not None:
            logger.warning("stopping at once (a second stop signal)")
            self.stop()
            return
        self.draining_since = time.monotonic()
        for port in self.ports:
            # Accept what the kernel has queued, which closing would reset.
            getattr(port, "doRead", lambda: None)()
            port.stopListening()
        for channel in self._open_channels():
            if channel.requests:  # its answer is the last on it
                channel.persistent = False
                for request in channel.requests:
                    if not request.startedWriting:
                        _answer_closes(request)
        logger.info(
            "stopping: no new connections; %d request(s) in progress may finish "
            "(at most %g s, GPUSCHED_STOP_SECONDS)",
            self.requests_in_progress(),
            _stop_seconds(),
        )
        task.LoopingCall(self._stop_when_drained).start(DRAIN_POLL_SECONDS)

    def requests_in_progress(self) -> int:
        """HTTP requests whose answer has not ended (WebSockets do not count)."""
        return sum(
            1
            for protocol, details in self.connections.items()
            if isinstance(protocol, WebRequest)
            and "disconnected" not in details
            and not protocol.finished
        )

    def _open_channels(self) -> list[HTTPChannel]:
        """The HTTP connections still open, WebSockets left out (Daphne hands
        an upgraded connection's transport to the WebSocket's protocol)."""
        return [
            channel
            for channel in self.channels
            if channel.transport is not None
            and channel.transport.connected
            and not channel.transport.disconnecting
            and getattr(channel.transport.protocol, "_channel", None) is channel
        ]

    def _kept_open(self, now: float) -> int:
        """How many HTTP connections are still open: busy ones, and idle ones
        not yet idle for IDLE_CLOSE_SECONDS. Those idle for longer are closed."""
        kept_open = 0
        for channel in self._open_channels():
            if channel.requests:
                self.idle_since.pop(channel, None)
                kept_open += 1
            elif now - self.idle_since.setdefault(channel, now) < IDLE_CLOSE_SECONDS:
                kept_open += 1
            else:
                channel.loseConnection()
        return kept_open

    def _stop_when_drained(self) -> None:
        assert self.draining_since is not None
        left = self.requests_in_progress()
        now = time.monotonic()
        waited = now - self.draining_since
        if waited < _stop_seconds():
            # Kept connections stay open, answered with a close, while any
            # request is in progress; their idle time counts from then on.
            if left or self._kept_open(now):
                return
        elif left:
            logger.warning("%d request(s) still in progress after %.0f s; stopping", left, waited)
        self.stop()


class _CommandLine(CommandLineInterface):
    server_class = DrainingServer


def main(argv: list[str] | None = None) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpusched.settings")
    _CommandLine().run(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    main()
