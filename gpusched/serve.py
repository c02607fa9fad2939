"""`python -m gpusched.serve`: Daphne, with a stop that lets requests finish.

Daphne's own stop (SIGTERM, SIGINT) ends the reactor at once and cancels
every request in progress: a front-door call relayed by this web server, or
a caller waiting for its job, would lose its answer at each restart. Here a
stop signal instead:

1. closes the listening sockets, so new connections go to another web
   server (nginx passes a refused connection to the next one) or are
   refused;
2. waits until every HTTP request in progress has ended, at most
   GPUSCHED_STOP_SECONDS (the dispatchers' own grace);
3. then stops as Daphne does: the WebSockets (the dashboard, which
   reconnects) and anything still running are closed.

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
from typing import Any

from daphne.cli import CommandLineInterface
from daphne.http_protocol import WebRequest
from daphne.server import Server
from twisted.internet import reactor, task

logger = logging.getLogger("gpusched.serve")

DEFAULT_STOP_SECONDS = 60.0
# How often the drain looks for requests still in progress.
DRAIN_POLL_SECONDS = 0.1


def _stop_seconds() -> float:
    """GPUSCHED_STOP_SECONDS, read as the settings read it (their default)."""
    try:
        return float(os.environ.get("GPUSCHED_STOP_SECONDS") or DEFAULT_STOP_SECONDS)
    except ValueError:
        return DEFAULT_STOP_SECONDS


class DrainingServer(Server):
    """Daphne's server with the stop described above."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["signal_handlers"] = False  # ours, installed once the reactor runs
        super().__init__(*args, **kwargs)
        self.ports: list[Any] = []
        self.draining_since: float | None = None

    def run(self) -> None:
        reactor.callWhenRunning(self._install_stop_signals)
        super().run()

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
            port.stopListening()
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

    def _stop_when_drained(self) -> None:
        assert self.draining_since is not None
        left = self.requests_in_progress()
        waited = time.monotonic() - self.draining_since
        if left and waited < _stop_seconds():
            return
        if left:
            logger.warning("%d request(s) still in progress after %.0f s; stopping", left, waited)
        self.stop()


class _CommandLine(CommandLineInterface):
    server_class = DrainingServer


def main(argv: list[str] | None = None) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpusched.settings")
    _CommandLine().run(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    main()
