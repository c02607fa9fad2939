"""A real webhook receiver on 127.0.0.1 for the delivery tests."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Answer = int | tuple[int, dict[str, str]]


class Receiver:
    """Answers each POST with the next scripted answer (a status, or a status
    and headers; 200 once the script is spent) and records what came."""

    def __init__(self, answers: list[Answer] | tuple[Answer, ...] = (), *, hang: bool = False):
        self.answers = list(answers)
        self.requests: list[dict[str, Any]] = []
        self.release = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.requests.append(
                    {
                        "path": self.path,
                        "headers": {k.lower(): v for k, v in self.headers.items()},
                        "body": body,
                        "at": time.time(),
                    }
                )
                if hang:
                    receiver.release.wait(30)
                answer = receiver.answers.pop(0) if receiver.answers else 200
                status, headers = answer if isinstance(answer, tuple) else (answer, {})
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()
