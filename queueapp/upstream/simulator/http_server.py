"""The simulator's HTTP server: threads per connection, every connection
dropped at a stop (as llama-swap's server closes them), a client hanging up
kept quiet. `server.LlamaSwapSimulator` sets its GPU, stop event and key gate;
`handler.SimulatorHandler` answers on it."""

from __future__ import annotations

import socket
import sys
import threading
from http.server import ThreadingHTTPServer
from typing import Any

from queueapp.upstream.simulator.api_keys import ApiKeyGate
from queueapp.upstream.simulator.gpu import SimulatedGpu


class SimulatorHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    gpu: SimulatedGpu
    stopping: threading.Event  # set when the server stops: jobs still sleeping end at once
    api_keys: ApiKeyGate

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._open_connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        with self._connections_lock:
            self._open_connections.add(request)
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._connections_lock:
                self._open_connections.discard(request)

    def drop_connections(self) -> None:
        """As a server that stops: kept-alive connections are closed too, so a
        client's next request on one is refused rather than still answered."""
        with self._connections_lock:
            for conn in self._open_connections:
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client hanging up mid-answer is normal for a proxy's upstream; stay quiet.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)
