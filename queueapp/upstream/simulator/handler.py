"""The simulator's HTTP handler: each request answered as llama-swap answers it.

`server.LlamaSwapSimulator` owns the simulated GPU and the HTTP server; this
module speaks HTTP for it (routes, errors, streams, the unload routes and
the events stream), with the same llama-swap sources as server.py names.
"""

from __future__ import annotations

import json
import select
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import unquote, urlsplit

from queueapp.upstream.model_field import extract_model
from queueapp.upstream.simulator.events import STREAM_HEADERS
from queueapp.upstream.simulator.gpu import Busy, SimulatedGpu, Unloading
from queueapp.upstream.simulator.http_server import SimulatorHTTPServer
from queueapp.upstream.simulator.inflight import InflightRequest, client_ip
from queueapp.upstream.simulator.payloads import (
    dumps,
    render_sized,
    server_page,
    server_props,
    silent_wav,
    stream_events,
)
from queueapp.upstream.simulator.routes import (
    GET_ROUTES,
    MODEL_ROUTES,
    MSG_BUSY,
    MSG_LOAD_UNLOADED,
    MSG_MODEL_NOT_FOUND,
    MSG_NO_MODEL,
    MSG_SIMULATED,
    MSG_UNKNOWN_MODEL,
    POST_ROUTES,
    RENDERING_KINDS,
    STATUS_CLIENT_GONE,
    STREAMING_KINDS,
    UNLOAD_MODEL_PREFIX,
    UPSTREAM_PREFIX,
    error_envelope,
    sim_options,
)
from queueapp.upstream.simulator.sizing import sized_seconds


class _LoadAborted(Exception):
    """An unload stopped the model while the request waited for its load."""


class _UpstreamKilled(Exception):
    """An unload killed the model's server while it computed the request's answer."""


def carry_out(gpu: SimulatedGpu, unloading: Unloading, stopping: threading.Event) -> None:
    """Wait for the stop under way to end (a stopping server ends it now), then end it."""
    stopping.wait(unloading.seconds_left())
    gpu.end_unload(unloading)


class SimulatorHandler(BaseHTTPRequestHandler):
    """One connection's requests, answered as llama-swap answers them."""

    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes; with Nagle's algorithm on,
    # the second waits for the client's delayed ACK (~40 ms). llama-swap (Go)
    # sets TCP_NODELAY, so the simulator does too.
    disable_nagle_algorithm = True
    server: SimulatorHTTPServer
    _seq: int | None = None  # the log entry this answer is recorded under, if any
    # The answer's headers so far, as llama-swap's in-flight record shows them.
    _response_headers: list[tuple[str, str]]

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the simulator reports requests through its own log instead

    def handle_one_request(self) -> None:
        self._seq = None  # a kept-alive connection's next request is recorded afresh
        self._response_headers = []
        super().handle_one_request()

    def parse_request(self) -> bool:
        # llama-swap's apiKeys check, before any route (api_keys.py).
        return super().parse_request() and self.server.api_keys.admits(self)

    def send_response(self, code: int, message: str | None = None) -> None:
        super().send_response(code, message)
        if self._seq is not None:
            self.server.gpu.record_sent(self._seq, status=code)

    def send_header(self, keyword: str, value: str) -> None:
        super().send_header(keyword, value)
        if self._seq is None:
            return
        if keyword.lower() == "content-type":
            self.server.gpu.record_sent(self._seq, content_type=value)
        if keyword not in ("Server", "Date"):  # Go's server adds those after the handler
            self._response_headers.append((keyword, value))

    def end_headers(self) -> None:
        if self._seq is not None:
            self.server.gpu.track_response_headers(self._seq, self._response_headers)
        super().end_headers()

    def _send(self, status: int, payload: bytes, ctype: str | None, **headers: str) -> None:
        self.send_response(status)
        if ctype is not None:
            self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(payload)))
        for name, value in headers.items():
            self.send_header(name.replace("_", "-"), value)
        self.end_headers()
        if self._seq is not None:  # before the write: a client that has it finds it recorded
            self.server.gpu.record_sent(self._seq, body=payload)
        self.wfile.write(payload)
        if self._seq is not None:
            self.server.gpu.track_response_bytes(self._seq, len(payload))

    def _send_error(
        self, status: int, message: str, code: str | None = None, **headers: str
    ) -> None:
        accept = self.headers.get("Accept", "")
        if "text/plain" in accept:
            self._send(status, f"llama-swap: {message}".encode(), "text/plain", **headers)
        elif "text/html" in accept:
            page = f"<html><body><h1>llama-swap</h1><p>{message}</p></body></html>"
            self._send(status, page.encode(), "text/html", **headers)
        else:
            envelope = dumps(error_envelope(status, message, code))
            self._send(status, envelope, "application/json", **headers)

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            parts = []
            while size := int(self.rfile.readline(1024).split(b";")[0].strip() or b"0", 16):
                parts.append(self.rfile.read(size))
                self.rfile.readline(1024)
            while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                pass  # trailers
            return b"".join(parts)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def do_GET(self) -> None:
        gpu = self.server.gpu
        path = urlsplit(self.path).path
        if path == "/health":
            self._send(200, b"OK", "text/plain; charset=utf-8")
        elif path == "/running":
            self._send(200, dumps(gpu.running()) + b"\n", "application/json")
        elif path in ("/v1/models", "/models"):
            self._send(200, dumps(gpu.list_models()) + b"\n", "application/json")
        elif path == "/api/events":
            self._serve_events()
        elif path == "/unload":  # handleUnload
            self._unload(None)
            self._send(200, b"OK", "text/plain; charset=utf-8")
        elif path == "/sim/log":
            self._send(200, dumps(gpu.log()), "application/json")
        elif path == "/sim/events":
            self._send(200, dumps({"enabled": gpu.events.enabled}), "application/json")
        elif path.startswith(UPSTREAM_PREFIX):
            self._serve_upstream(path, time.time())
        else:
            self._not_routed(path)

    def do_POST(self) -> None:
        received_at = time.time()
        url = urlsplit(self.path)
        raw = self._read_body()
        if url.path == "/sim/reset":
            self.server.gpu.reset_log()
            self._send(200, dumps({"ok": True}), "application/json")
        elif url.path == "/sim/events":
            self._switch_events(raw)
        elif url.path == "/api/models/unload":  # handleAPIUnloadAll
            self._unload(None)
            self._send(200, dumps({"msg": "ok"}) + b"\n", "application/json")
        elif url.path.startswith(UNLOAD_MODEL_PREFIX):
            self._unload_model(unquote(url.path[len(UNLOAD_MODEL_PREFIX) :]))
        elif url.path in MODEL_ROUTES:
            self._serve_model(url.path, url.query, raw, received_at)
        else:
            self._not_routed(url.path)

    def _not_routed(self, path: str) -> None:
        # Mirrors Go's ServeMux, which answers before any llama-swap handler runs.
        if path in MODEL_ROUTES or path in POST_ROUTES or path.startswith(UNLOAD_MODEL_PREFIX):
            self._send(405, b"Method Not Allowed\n", "text/plain; charset=utf-8", Allow="POST")
        elif path in GET_ROUTES:
            self._send(405, b"Method Not Allowed\n", "text/plain; charset=utf-8", Allow="GET, HEAD")
        else:
            self._send(404, b"404 page not found\n", "text/plain; charset=utf-8")

    def _serve_model(self, path: str, query: str, raw: bytes, received_at: float) -> None:
        gpu = self.server.gpu
        model, body = extract_model(self.headers.get("Content-Type", ""), raw, query)
        model = gpu.real_model(model) if model else model
        entry = gpu.open_entry(path, model, body, received_at, raw=raw)
        self._seq = entry["seq"]
        if model:  # llama-swap lists a request in flight once its model is identified
            gpu.track(entry, self._inflight_request(entry, path, model, received_at))
        seconds = gpu.seconds_for(model) if model else None
        try:
            opts = sim_options(body)
        except ValueError as exc:
            opts, invalid = {}, str(exc)
        else:
            invalid = ""
        if seconds is None or invalid:
            # Same order as llama-swap: no model, then unknown model, both before admission.
            if not model:
                refusal = (404, MSG_NO_MODEL)
            elif seconds is None:
                refusal = (404, MSG_UNKNOWN_MODEL)
            else:
                refusal = (400, f"simulator: {invalid}")
            gpu.close(entry, refusal[0], release=False)
            self._send_error(*refusal)
            return
        if "seconds" not in opts and gpu.scales_with_size(model):
            seconds = sized_seconds(MODEL_ROUTES[path], seconds, body, body_bytes=len(raw))
        admission = gpu.admit(entry, model, opts.get("seconds", seconds))
        if isinstance(admission, Busy):
            gpu.close(entry, 429, release=False)
            retry_after = str(admission.retry_after)
            self._send_error(429, MSG_BUSY, "concurrency_limit", Retry_After=retry_after)
            return
        seconds, cut = admission.run_seconds, admission.cut
        status = 500
        try:
            self._wait(admission.load_seconds, cut)
            gpu.loaded(model)  # whichever of the requests waiting for the load ends it first
            kind = MODEL_ROUTES[path]
            spend = self._render if kind in RENDERING_KINDS else self._hold
            if "status" in opts:
                spend(seconds, cut)
                status = opts["status"]
                extra = {"Retry_After": "1"} if status in (429, 503) else {}
                self._send_error(status, MSG_SIMULATED, **extra)
            elif kind in STREAMING_KINDS and isinstance(body, dict) and body.get("stream") is True:
                status = 200
                self._stream(kind, model, body, seconds, opts.get("size_bytes", 0), cut)
            else:
                spend(seconds, cut)
                status = 200
                self._answer(kind, model, body, opts.get("size_bytes", 0))
        except _LoadAborted:
            status = 500
            self._send_error(status, MSG_LOAD_UNLOADED)
        except _UpstreamKilled:
            status = 502  # the reverse proxy's own answer: no body, no content type
            self._send(status, b"", None)
        except ConnectionError:
            status, self.close_connection = STATUS_CLIENT_GONE, True
        finally:
            gpu.close(entry, status, release=True)

    def _inflight_request(
        self, entry: dict[str, Any], path: str, model: str, received_at: float
    ) -> InflightRequest:
        remote_ip = client_ip(
            self.headers.get("X-Forwarded-For", ""),
            self.headers.get("X-Real-IP", ""),
            peer_host=self.client_address[0],
        )
        return InflightRequest.arriving(
            request_id=str(entry["seq"]),
            started_at=received_at,
            model=model,
            method=self.command,
            path=path,
            headers=self.headers.items(),
            remote_ip=remote_ip,
        )

    def _serve_upstream(self, path: str, received_at: float) -> None:
        """``GET /upstream/<model>/``: llama-swap swaps the model in and proxies ``GET /``
        to its server, which is how it loads a model without a request (its UI's "Load"
        and its startup preload). Here: the swap, if any, then the server's page; or, for
        ``/props``, llama-server's properties with its slots (``total_slots``), answered
        at once when the model is ready (no slot taken, nothing logged). The
        longest known model name at the start of the path is the model, as llama-swap
        finds it."""
        gpu = self.server.gpu
        parts = unquote(path[len(UPSTREAM_PREFIX) :]).split("/")
        known = [
            i
            for i in range(1, len(parts) + 1)
            if parts[i - 1] and gpu.seconds_for("/".join(parts[:i])) is not None
        ]
        if not parts[0] or not known:
            self._send_error(404, MSG_MODEL_NOT_FOUND)
            return
        model, rest = "/".join(parts[: known[-1]]), parts[known[-1] :]
        if not rest:  # llama-swap redirects to the root, so relative links resolve
            self._send(301, b"", "text/plain; charset=utf-8", Location=path + "/")
            return
        real = gpu.real_model(model)
        if rest == ["props"] and self._is_ready(real):
            # A ready llama-server answers /props at once, beside its slots' requests.
            self._send(200, server_props(real, gpu.parallel_for(real)), "application/json")
            return
        entry = gpu.open_entry(path, model, None, received_at)
        self._seq = entry["seq"]
        admission = gpu.admit(entry, model, 0.0)
        if isinstance(admission, Busy):
            gpu.close(entry, 429, release=False)
            retry_after = str(admission.retry_after)
            self._send_error(429, MSG_BUSY, "concurrency_limit", Retry_After=retry_after)
            return
        status = 500
        try:
            self._wait(admission.load_seconds, admission.cut)
            gpu.loaded(model)
            status = 200
            if rest == ["props"]:
                self._send(200, server_props(real, gpu.parallel_for(real)), "application/json")
            else:
                self._send(200, server_page(model), "text/html; charset=utf-8")
        except _LoadAborted:
            self._send_error(status, MSG_LOAD_UNLOADED)
        except ConnectionError:
            status, self.close_connection = STATUS_CLIENT_GONE, True
        finally:
            gpu.close(entry, status, release=True)

    def _is_ready(self, model: str) -> bool:
        return any(
            entry["model"] == model and entry["state"] == "ready"
            for entry in self.server.gpu.running()["running"]
        )

    def _answer(self, kind: str, model: str, body: Any, size: int) -> None:
        n = self.server.gpu.next_answer()
        if kind == "speech":
            self._send(200, silent_wav(size), "audio/wav")
            return
        payload = render_sized(kind, model, n, body, int(time.time()), size)
        self._send(200, payload, "application/json")

    def _serve_events(self) -> None:
        """``GET /api/events``: llama-swap's event stream, until the client leaves or the
        server stops (then the stream ends cleanly, as Go's handler returns)."""
        gpu, stopping = self.server.gpu, self.server.stopping
        subscription = gpu.subscribe_events()
        try:
            self.send_response(200)
            for name, value in STREAM_HEADERS.items():
                self.send_header(name, value)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self.wfile.flush()  # headers now, even with events off and nothing to send
            while not stopping.is_set():
                data = subscription.next_frame(timeout=0.1)
                if data is not None:
                    self._write_chunk(data)
                elif self._client_gone():
                    self.close_connection = True
                    return
            self._write_chunk(b"")
        except ConnectionError:
            self.close_connection = True
        finally:
            gpu.events.unsubscribe(subscription)

    def _unload(self, models: list[str] | None) -> None:
        """Stop the resident model if it is one of ``models`` (None: any) and wait for the
        stop to end, as llama-swap's Unload blocks until the process has stopped."""
        unloading = self.server.gpu.begin_unload(models)
        if unloading is not None:
            carry_out(self.server.gpu, unloading, self.server.stopping)

    def _unload_model(self, requested: str) -> None:
        """``POST /api/models/unload/{model}`` (handleAPIUnloadModel)."""
        model = self.server.gpu.real_model(requested.removeprefix("/"))
        if not model or self.server.gpu.seconds_for(model) is None:
            self._send_error(404, MSG_MODEL_NOT_FOUND)
            return
        self._unload([model])
        self._send(200, b"OK", "text/plain; charset=utf-8")

    def _switch_events(self, raw: bytes) -> None:
        """``POST /sim/events`` ``{"enabled": bool}``: the simulator-only event switch."""
        try:
            enabled = json.loads(raw).get("enabled")
        except (ValueError, AttributeError):
            enabled = None
        if not isinstance(enabled, bool):
            self._send_error(400, 'simulator: expected {"enabled": true|false}')
            return
        self.server.gpu.events.set_enabled(enabled)
        self._send(200, dumps({"enabled": enabled}), "application/json")

    def _stream(
        self,
        kind: str,
        model: str,
        body: dict[str, Any],
        seconds: float,
        size: int,
        cut: threading.Event,
    ) -> None:
        n = self.server.gpu.next_answer()
        events = stream_events(kind, model, n, body, int(time.time()), size)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        interval = seconds / (len(events) - 1)
        try:
            for i, event in enumerate(events):
                if i:
                    self._hold(interval, cut)
                self._write_chunk(b"data: " + dumps(event) + b"\n\n")
            self._write_chunk(b"data: [DONE]\n\n")
        except _UpstreamKilled:
            pass  # llama-swap recovers the proxy's abort: the answer just ends here
        self._write_chunk(b"")

    def _sleep(self, seconds: float, cut: threading.Event) -> bool:
        """Spend ``seconds`` unless the server stops; True when an unload cut them short."""
        deadline = time.monotonic() + seconds
        stopping = self.server.stopping
        while (left := deadline - time.monotonic()) > 0 and not stopping.is_set():
            if cut.wait(min(left, 0.1)):
                return True
        return cut.is_set()

    def _wait(self, seconds: float, cut: threading.Event) -> None:
        """Spend time the client cannot cut short (a cold load); a stopping server ends it,
        an unload of the model aborts it."""
        if self._sleep(seconds, cut):
            raise _LoadAborted

    def _hold(self, seconds: float, cut: threading.Event) -> None:
        """Spend job time, but end early when the client hangs up: llama-swap cancels the
        upstream request then, and llama-server stops generating, so the GPU is free again
        at once. An unload of the model kills it."""
        deadline = time.monotonic() + seconds
        stopping = self.server.stopping
        while (left := deadline - time.monotonic()) > 0 and not stopping.is_set():
            if cut.is_set():
                raise _UpstreamKilled
            readable, _, _ = select.select([self.connection], [], [], min(left, 0.1))
            if not readable:
                continue
            if self._client_gone():
                raise ConnectionAbortedError("client closed the connection")
            if self._sleep(left, cut):  # a pipelined request, not a hang-up: just wait
                raise _UpstreamKilled
            return
        if cut.is_set():
            raise _UpstreamKilled

    def _render(self, seconds: float, cut: threading.Event) -> None:
        """Spend job time whether or not the client is still there, as an image or audio
        server does: its request ends, and frees the GPU, when the render does (or when an
        unload kills it)."""
        if self._sleep(seconds, cut):
            raise _UpstreamKilled
        if self._client_gone():
            raise ConnectionAbortedError("client closed the connection during the render")

    def _client_gone(self) -> bool:
        """Whether the client has closed its connection (a pipelined request is not that)."""
        readable, _, _ = select.select([self.connection], [], [], 0)
        if not readable:
            return False
        try:
            return not self.connection.recv(1, socket.MSG_PEEK)
        except OSError:
            return True

    def _write_chunk(self, data: bytes) -> None:
        if self._seq is not None:
            self.server.gpu.record_sent(self._seq, body=data)
        self.wfile.write(b"%X\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()
        if self._seq is not None:
            self.server.gpu.track_response_bytes(self._seq, len(data))
