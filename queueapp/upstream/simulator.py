"""A stand-in for llama-swap that needs no GPU, for ``make run`` and the end-to-end tests.

It speaks llama-swap's HTTP surface (paths, model selection, ``/running``, ``/v1/models``,
``/health``, the error envelope, the 429 concurrency-limit answer) so the dispatcher is
exercised exactly as it would be against the real proxy. Pure standard library on purpose:
it is started as a separate process and must not depend on Django being configured.

llama-swap source files matched (mostlygeek/llama-swap):
  internal/server/server.go         model routes (JSON vs multipart), GET routes, /health
  internal/server/api.go            /v1/models records, /running entries, /health body
  internal/swaputil/http.go         model lookup by Content-Type, error messages and statuses,
                                    Accept-dependent error format
  internal/swaputil/httperror.go    error envelope, status -> type/code, 429 + Retry-After
  internal/router/scheduler/fifo.go unknown model is refused before the concurrency check
  internal/process/process.go       process states ("starting", "ready")

Simulator-only extensions (not llama-swap's; real backends ignore unknown body keys):
  * request body key ``"sim": {"seconds": float, "status": int, "size_bytes": int}`` overrides
    the job duration, answers with an llama-swap style error of that status after the job
    time, or pads the answer to at least that many bytes (in the text field where the answer
    has one, otherwise in a top-level ``"sim_padding"`` string);
  * ``GET /sim/log`` and ``POST /sim/reset``. Log entries: ``started_at`` is the admission
    time (a swap counts as part of the job), in-flight entries have ``finished_at`` and
    ``status`` null, refused ones have ``started_at`` null, and a client that hung up before
    the answer was complete is logged with status 499;
  * ``sent(seq)``: what was answered to the log entry ``seq`` (status, content type, body
    bytes; a stream's events without the chunk framing), kept for the latest answers only,
    so a test can compare a proxy's answer with the simulator's byte for byte.

Deliberate simplifications: llama-swap's concurrency limit is per model and requests for
another model wait in its queue; here any request that arrives while one is being served is
refused, which is what a dispatcher configured for one GPU must never provoke. llama-swap
always sends ``Retry-After: 1``; here it estimates the remaining time of the running job.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import io
import json
import math
import select
import signal
import socket
import struct
import sys
import threading
import time
import wave
import zlib
from collections.abc import Callable, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from queueapp.upstream.model_field import extract_model

JSON_ROUTES = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completion",
    "/v1/responses": "responses",
    "/v1/embeddings": "embeddings",
    "/v1/images/generations": "image",
    "/v1/audio/speech": "speech",
    "/sdapi/v1/txt2img": "sdapi",
    "/sdapi/v1/img2img": "sdapi",
}
FORM_ROUTES = {"/v1/audio/transcriptions": "transcription", "/v1/images/edits": "image"}
MODEL_ROUTES = {**JSON_ROUTES, **FORM_ROUTES}
GET_ROUTES = ("/running", "/v1/models", "/models", "/health", "/sim/log")
STREAMING_KINDS = ("chat", "completion")
TEXT_KINDS = ("chat", "completion", "responses", "transcription")

MSG_NO_MODEL = "no model id could be identified"
MSG_UNKNOWN_MODEL = "no router for requested model"
MSG_BUSY = "Too many requests"
MSG_SIMULATED = "simulated upstream error"
STATUS_CLIENT_GONE = 499  # logged only: the client hung up before the answer was complete
SENT_KEPT = 64  # answers kept for sent(): bounded, as a long run serves many

_ERROR_TYPES = {
    400: ("invalid_request_error", "bad_request"),
    401: ("authentication_error", "unauthorized"),
    403: ("authentication_error", "forbidden"),
    404: ("invalid_request_error", "not_found"),
    409: ("invalid_request_error", "conflict"),
    429: ("rate_limit_error", "rate_limit_exceeded"),
    502: ("server_error", "bad_gateway"),
    503: ("server_error", "service_unavailable"),
    504: ("server_error", "gateway_timeout"),
}


def error_envelope(status: int, message: str, code: str | None = None) -> dict[str, Any]:
    """llama-swap's JSON error body for ``status``; ``code`` overrides the derived code."""
    default = ("invalid_request_error", "invalid_request") if status < 500 else None
    err_type, err_code = _ERROR_TYPES.get(status, default or ("server_error", "internal_error"))
    return {
        "src": "llama-swap",
        "error": {"message": message, "type": err_type, "param": None, "code": code or err_code},
    }


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _tiny_png() -> bytes:
    def chunk(tag: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(tag + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", 1, 1, 8, 6, 0, 0, 0)  # 1x1 RGBA
    pixels = zlib.compress(b"\x00\x00\x00\x00\x00")  # filter byte + one transparent pixel
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")
    )


PNG_B64 = base64.b64encode(_tiny_png()).decode()


def _silent_wav(min_bytes: int = 0) -> bytes:
    frames = max(800, (min_bytes - 44 + 1) // 2)  # 16-bit mono; 44-byte RIFF header
    buf = io.BytesIO()
    with wave.open(buf, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(8000)
        out.writeframes(b"\x00\x00" * frames)
    return buf.getvalue()


def _sim_options(body: Any) -> dict[str, Any]:
    sim = body.get("sim") if isinstance(body, dict) else None
    if sim is None:
        return {}
    if not isinstance(sim, dict):
        raise ValueError("'sim' must be an object")
    opts: dict[str, Any] = {}
    if "seconds" in sim:
        seconds = sim["seconds"]
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds < 0:
            raise ValueError("'sim.seconds' must be a number >= 0")
        opts["seconds"] = float(seconds)
    for key, low, high in (("status", 400, 599), ("size_bytes", 0, 1 << 30)):
        if key in sim:
            value = sim[key]
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ValueError(f"'sim.{key}' must be an integer in [{low}, {high}]")
            opts[key] = value
    return opts


def _token_estimate(body: Any) -> int:
    if not isinstance(body, dict):
        return 0
    source = body.get("messages") or body.get("prompt") or body.get("input") or ""
    return len(json.dumps(source).split())


def _embedding(model: str, text: str) -> list[float]:
    digest = hashlib.sha256(f"{model}\0{text}".encode()).digest()
    return [round(byte / 255 * 2 - 1, 6) for byte in digest[:8]]


def _render(kind: str, model: str, n: int, body: Any, text: str, now: int) -> dict[str, Any]:
    body = body if isinstance(body, dict) else {}
    prompt = _token_estimate(body)
    words = len(text.split())
    usage = {"prompt_tokens": prompt, "completion_tokens": words, "total_tokens": prompt + words}
    if kind in ("chat", "completion"):
        head = {"id": f"chatcmpl-sim-{n}", "object": "chat.completion"}
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text}}
        if kind == "completion":
            head = {"id": f"cmpl-sim-{n}", "object": "text_completion"}
            choice = {"index": 0, "text": text, "logprobs": None}
        choice["finish_reason"] = "stop"
        return {**head, "created": now, "model": model, "choices": [choice], "usage": usage}
    if kind == "responses":
        part = {"type": "output_text", "text": text, "annotations": []}
        output = {"type": "message", "id": f"msg_sim_{n}", "status": "completed"}
        output.update(role="assistant", content=[part])
        tokens = {"input_tokens": prompt, "output_tokens": words, "total_tokens": prompt + words}
        response = {"id": f"resp_sim_{n}", "object": "response", "created_at": now}
        response.update(status="completed", model=model, output=[output], usage=tokens)
        return response
    if kind == "transcription":
        return {"text": text}
    if kind == "embeddings":
        raw = body.get("input", "")
        inputs = raw if isinstance(raw, list) and raw else [raw]
        data = [
            {"object": "embedding", "index": i, "embedding": _embedding(model, json.dumps(item))}
            for i, item in enumerate(inputs)
        ]
        tokens = {"prompt_tokens": prompt, "total_tokens": prompt}
        return {"object": "list", "data": data, "model": model, "usage": tokens}
    if kind == "image":
        return {"created": now, "data": [{"b64_json": PNG_B64}]}
    # sdapi: AUTOMATIC1111's txt2img/img2img answer, where "info" is a JSON string.
    parameters = {k: v for k, v in body.items() if k != "sim"}
    info = json.dumps({"model": model, "seed": n, "prompt": body.get("prompt", "")})
    return {"images": [PNG_B64], "parameters": parameters, "info": info}


def _render_sized(kind: str, model: str, n: int, body: Any, now: int, size: int) -> bytes:
    text = f"Simulated reply #{n} from {model}: the quick brown fox jumps over the lazy dog."
    encoded = _dumps(_render(kind, model, n, body, text, now))
    deficit = size - len(encoded)
    if deficit <= 0:
        return encoded
    if kind in TEXT_KINDS:
        return _dumps(_render(kind, model, n, body, text + " " + "x" * deficit, now))
    padded = _render(kind, model, n, body, text, now)
    padded["sim_padding"] = "x" * deficit
    return _dumps(padded)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    simulator: LlamaSwapSimulator

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


def occupancy_seconds(
    *, resident: str | None, model: str, seconds: float, swap_seconds: float
) -> float:
    """How long a job holds the GPU: its own run, plus one flat cold load when
    its model is not the resident one (llama-swap stops the resident process
    and starts the requested one before the request runs). The policy
    simulator (queueapp/simulation/) charges swaps with this same rule."""
    return seconds + (swap_seconds if resident != model else 0.0)


class LlamaSwapSimulator:
    """One simulated GPU behind llama-swap: one resident model, one request at a time."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        models: Mapping[str, float] | None = None,
        *,
        default_seconds: float = 1.0,
        accept_any_model: bool = False,
        swap_seconds: float = 1.0,
        initial_model: str | None = None,
        on_request: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.host = host
        self.models = {name: float(seconds) for name, seconds in (models or {}).items()}
        if min([default_seconds, swap_seconds, *self.models.values()]) < 0:
            raise ValueError("durations must be >= 0")
        self.default_seconds = float(default_seconds)
        self.accept_any_model = accept_any_model
        self.swap_seconds = float(swap_seconds)
        self.on_request = on_request
        if initial_model is not None and self.seconds_for(initial_model) is None:
            raise ValueError(f"unknown initial model {initial_model!r}")
        self._requested_port = port
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._resident: str | None = initial_model
        self._resident_state = "ready"
        self._busy_until: float | None = None
        self._log: list[dict[str, Any]] = []
        self._sent: dict[int, dict[str, Any]] = {}
        self._seq = 0
        self._answers = 0
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> LlamaSwapSimulator:
        """Bind and serve in a background thread; the socket is listening on return."""
        if self._httpd is not None:
            raise RuntimeError("simulator already started")
        self._stopping.clear()
        httpd = _HTTPServer((self.host, self._requested_port), _Handler)
        httpd.simulator = self
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving; jobs still sleeping finish at once."""
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        self._stopping.set()
        httpd.shutdown()
        httpd.server_close()
        httpd.drop_connections()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> LlamaSwapSimulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("simulator not started")
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # -- introspection ---------------------------------------------------------------------

    def log(self) -> list[dict[str, Any]]:
        """Handled model requests in arrival order (copies; in-flight ones have nulls)."""
        with self._lock:
            return [dict(entry) for entry in self._log]

    def reset_log(self) -> None:
        """Forget the log; the resident model and the sequence counter are kept."""
        with self._lock:
            self._log.clear()
            self._sent.clear()

    def sent(self, seq: int) -> dict[str, Any] | None:
        """What was answered to log entry ``seq``: ``status``, ``content_type`` and ``body``
        (bytes; a stream's events without the chunk framing), each recorded before it is
        written, so a client that has read the answer finds it here. None once forgotten."""
        with self._lock:
            record = self._sent.get(seq)
            return None if record is None else {**record, "body": bytes(record["body"])}

    def running(self) -> dict[str, Any]:
        """The body of ``GET /running``."""
        with self._lock:
            resident, state = self._resident, self._resident_state
        if resident is None:
            return {"running": []}
        entry = {"model": resident, "state": state, "cmd": "", "proxy": "", "ttl": 0}
        return {"running": [{**entry, "name": "", "description": ""}]}

    def list_models(self) -> dict[str, Any]:
        """The body of ``GET /v1/models``: configured models only, as llama-swap lists them."""
        created = int(time.time())
        with self._lock:
            resident = self._resident
        data = []
        for name in sorted(self.models):
            record = {"id": name, "object": "model", "created": created, "owned_by": "llama-swap"}
            status = {"value": "loaded" if name == resident else "unloaded"}
            data.append({**record, "meta": {"llamaswap": {"type": "model"}}, "status": status})
        return {"object": "list", "data": data}

    def seconds_for(self, model: str) -> float | None:
        if model in self.models:
            return self.models[model]
        return self.default_seconds if self.accept_any_model else None

    # -- request bookkeeping (called from handler threads) ---------------------------------

    def _open_entry(self, path: str, model: str, body: Any, received_at: float) -> dict[str, Any]:
        with self._lock:
            self._seq += 1
            entry = {"seq": self._seq, "path": path, "model": model or None}
            entry.update(received_at=received_at, started_at=None, finished_at=None)
            entry.update(swapped=False, status=None, body=body)
            self._log.append(entry)
            return entry

    def _admit(self, entry: dict[str, Any], model: str, seconds: float) -> int:
        """Claim the GPU; returns 0 when admitted, else the Retry-After seconds."""
        with self._lock:
            now = time.time()
            if self._busy_until is not None:
                return max(1, math.ceil(self._busy_until - now))
            swapped = self._resident != model
            self._busy_until = now + occupancy_seconds(
                resident=self._resident,
                model=model,
                seconds=seconds,
                swap_seconds=self.swap_seconds,
            )
            if swapped:
                self._resident, self._resident_state = model, "starting"
            entry["started_at"], entry["swapped"] = now, swapped
            return 0

    def _loaded(self, model: str) -> None:
        with self._lock:
            if self._resident == model:
                self._resident_state = "ready"

    def _record_sent(self, seq: int, **fields: Any) -> None:
        with self._lock:
            record = self._sent.setdefault(
                seq, {"status": None, "content_type": None, "body": bytearray()}
            )
            record["body"].extend(fields.pop("body", b""))
            record.update(fields)
            while len(self._sent) > SENT_KEPT:
                del self._sent[next(iter(self._sent))]

    def _next_answer(self) -> int:
        with self._lock:
            self._answers += 1
            return self._answers

    def _close(self, entry: dict[str, Any], status: int, release: bool) -> None:
        with self._lock:
            entry["finished_at"], entry["status"] = time.time(), status
            if release:
                self._busy_until = None
            snapshot = dict(entry)
        if self.on_request is not None:
            self.on_request(snapshot)

    def _wait(self, seconds: float) -> None:
        if seconds > 0:
            self._stopping.wait(seconds)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes; with Nagle's algorithm on,
    # the second waits for the client's delayed ACK (~40 ms). llama-swap (Go)
    # sets TCP_NODELAY, so the simulator does too.
    disable_nagle_algorithm = True
    server: _HTTPServer
    _seq: int | None = None  # the log entry this answer is recorded under, if any

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the simulator reports requests through its own log instead

    def handle_one_request(self) -> None:
        self._seq = None  # a kept-alive connection's next request is recorded afresh
        super().handle_one_request()

    def send_response(self, code: int, message: str | None = None) -> None:
        super().send_response(code, message)
        if self._seq is not None:
            self.server.simulator._record_sent(self._seq, status=code)

    def send_header(self, keyword: str, value: str) -> None:
        super().send_header(keyword, value)
        if self._seq is not None and keyword.lower() == "content-type":
            self.server.simulator._record_sent(self._seq, content_type=value)

    def _send(self, status: int, payload: bytes, ctype: str, **headers: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(payload)))
        for name, value in headers.items():
            self.send_header(name.replace("_", "-"), value)
        self.end_headers()
        if self._seq is not None:  # before the write: a client that has it finds it recorded
            self.server.simulator._record_sent(self._seq, body=payload)
        self.wfile.write(payload)

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
            envelope = _dumps(error_envelope(status, message, code))
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
        sim = self.server.simulator
        path = urlsplit(self.path).path
        if path == "/health":
            self._send(200, b"OK", "text/plain; charset=utf-8")
        elif path == "/running":
            self._send(200, _dumps(sim.running()) + b"\n", "application/json")
        elif path in ("/v1/models", "/models"):
            self._send(200, _dumps(sim.list_models()) + b"\n", "application/json")
        elif path == "/sim/log":
            self._send(200, _dumps(sim.log()), "application/json")
        else:
            self._not_routed(path)

    def do_POST(self) -> None:
        received_at = time.time()
        url = urlsplit(self.path)
        raw = self._read_body()
        if url.path == "/sim/reset":
            self.server.simulator.reset_log()
            self._send(200, _dumps({"ok": True}), "application/json")
        elif url.path in MODEL_ROUTES:
            self._serve_model(url.path, url.query, raw, received_at)
        else:
            self._not_routed(url.path)

    def _not_routed(self, path: str) -> None:
        # Mirrors Go's ServeMux, which answers before any llama-swap handler runs.
        if path in MODEL_ROUTES or path == "/sim/reset":
            self._send(405, b"Method Not Allowed\n", "text/plain; charset=utf-8", Allow="POST")
        elif path in GET_ROUTES:
            self._send(405, b"Method Not Allowed\n", "text/plain; charset=utf-8", Allow="GET, HEAD")
        else:
            self._send(404, b"404 page not found\n", "text/plain; charset=utf-8")

    def _serve_model(self, path: str, query: str, raw: bytes, received_at: float) -> None:
        sim = self.server.simulator
        model, body = extract_model(self.headers.get("Content-Type", ""), raw, query)
        entry = sim._open_entry(path, model, body, received_at)
        self._seq = entry["seq"]
        seconds = sim.seconds_for(model) if model else None
        try:
            opts = _sim_options(body)
        except ValueError as exc:
            opts, invalid = {}, str(exc)
        else:
            invalid = ""
        # Same order as llama-swap: no model, then unknown model, both before admission.
        refusal = None
        if not model:
            refusal = (404, MSG_NO_MODEL)
        elif seconds is None:
            refusal = (404, MSG_UNKNOWN_MODEL)
        elif invalid:
            refusal = (400, f"simulator: {invalid}")
        if refusal is not None:
            sim._close(entry, refusal[0], release=False)
            self._send_error(*refusal)
            return
        seconds = opts.get("seconds", seconds)
        retry_after = sim._admit(entry, model, seconds)
        if retry_after:
            sim._close(entry, 429, release=False)
            self._send_error(429, MSG_BUSY, "concurrency_limit", Retry_After=str(retry_after))
            return
        status = 500
        try:
            if entry["swapped"]:
                sim._wait(sim.swap_seconds)
                sim._loaded(model)
            kind = MODEL_ROUTES[path]
            if "status" in opts:
                self._hold(seconds)
                status = opts["status"]
                extra = {"Retry_After": "1"} if status in (429, 503) else {}
                self._send_error(status, MSG_SIMULATED, **extra)
            elif kind in STREAMING_KINDS and isinstance(body, dict) and body.get("stream") is True:
                status = 200
                self._stream(kind, model, body, seconds, opts.get("size_bytes", 0))
            else:
                self._hold(seconds)
                status = 200
                self._answer(kind, model, body, opts.get("size_bytes", 0))
        except ConnectionError:
            status, self.close_connection = STATUS_CLIENT_GONE, True
        finally:
            sim._close(entry, status, release=True)

    def _answer(self, kind: str, model: str, body: Any, size: int) -> None:
        n = self.server.simulator._next_answer()
        if kind == "speech":
            self._send(200, _silent_wav(size), "audio/wav")
            return
        payload = _render_sized(kind, model, n, body, int(time.time()), size)
        self._send(200, payload, "application/json")

    def _stream(self, kind: str, model: str, body: dict, seconds: float, size: int) -> None:
        sim = self.server.simulator
        n = sim._next_answer()
        now = int(time.time())
        text = f"Simulated reply #{n} from {model}: the quick brown fox jumps over the lazy dog."
        if size > len(text):
            text += " " + "x" * (size - len(text))
        pieces = [text[i * len(text) // 4 : (i + 1) * len(text) // 4] for i in range(4)]
        if kind == "chat":
            base = {"id": f"chatcmpl-sim-{n}", "object": "chat.completion.chunk"}
            deltas = [{"role": "assistant", "content": ""}] + [{"content": p} for p in pieces]
            choices = [{"index": 0, "delta": d, "finish_reason": None} for d in deltas]
            choices.append({"index": 0, "delta": {}, "finish_reason": "stop"})
        else:
            base = {"id": f"cmpl-sim-{n}", "object": "text_completion"}
            choices = [
                {"index": 0, "text": p, "logprobs": None, "finish_reason": None} for p in pieces
            ]
            choices.append({"index": 0, "text": "", "logprobs": None, "finish_reason": "stop"})
        events: list[dict[str, Any]] = [
            {**base, "created": now, "model": model, "choices": [choice]} for choice in choices
        ]
        stream_options = body.get("stream_options")
        if isinstance(stream_options, dict) and stream_options.get("include_usage"):
            usage = _render(kind, model, n, body, text, now)["usage"]
            events.append({**base, "created": now, "model": model, "choices": [], "usage": usage})

        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        interval = seconds / (len(events) - 1)
        for i, event in enumerate(events):
            if i:
                self._hold(interval)
            self._write_chunk(b"data: " + _dumps(event) + b"\n\n")
        self._write_chunk(b"data: [DONE]\n\n")
        self._write_chunk(b"")

    def _hold(self, seconds: float) -> None:
        """Spend job time, but end early when the client hangs up: llama-swap cancels the
        upstream request then, so the GPU is free again at once."""
        deadline = time.monotonic() + seconds
        stopping = self.server.simulator._stopping
        while (left := deadline - time.monotonic()) > 0 and not stopping.is_set():
            readable, _, _ = select.select([self.connection], [], [], min(left, 0.1))
            if not readable:
                continue
            try:
                gone = not self.connection.recv(1, socket.MSG_PEEK)
            except OSError:
                gone = True
            if gone:
                raise ConnectionAbortedError("client closed the connection")
            stopping.wait(left)  # a pipelined request, not a hang-up: just wait
            return

    def _write_chunk(self, data: bytes) -> None:
        if self._seq is not None:
            self.server.simulator._record_sent(self._seq, body=data)
        self.wfile.write(b"%X\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()


# -- command line ----------------------------------------------------------------------------


def _model_spec(text: str) -> tuple[str, float]:
    name, sep, seconds = text.rpartition("=")
    try:
        value = float(seconds)
    except ValueError:
        value = -1.0
    if not sep or not name or value < 0:
        raise argparse.ArgumentTypeError(f"expected NAME=SECONDS with SECONDS >= 0, got {text!r}")
    return name, value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options shared by ``python -m ...simulator`` and the ``simulate_llama_swap`` command."""
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9292, help="0 picks a free port")
    parser.add_argument("--model", action="append", type=_model_spec, metavar="NAME=SECONDS")
    parser.add_argument("--swap-seconds", type=float, default=1.0, help="cold-load cost")
    parser.add_argument("--accept-any-model", action="store_true", help="serve unknown models too")
    parser.add_argument("--default-seconds", type=float, default=1.0, help="for unknown models")
    parser.add_argument("--initial-model", default=None, help="model resident at start")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m queueapp.upstream.simulator",
        description="Simulated llama-swap: one GPU, one resident model, one request at a time.",
    )
    add_arguments(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    """Serve until SIGINT/SIGTERM; prints the listening line, then one JSON line per request."""
    print_lock = threading.Lock()

    def report(entry: dict[str, Any]) -> None:
        line = json.dumps({k: v for k, v in entry.items() if k != "body"})
        with print_lock:
            print(line, flush=True)

    try:
        names = ("default_seconds", "accept_any_model", "swap_seconds", "initial_model")
        options = {name: getattr(args, name) for name in names}
        models = dict(args.model or [])
        sim = LlamaSwapSimulator(args.host, args.port, models, on_request=report, **options)
        sim.start()
    except (OSError, ValueError) as exc:
        print(f"llama-swap simulator: {exc}", file=sys.stderr, flush=True)
        return 1
    stop = threading.Event()
    previous = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        try:
            previous[signum] = signal.signal(signum, lambda *_: stop.set())
        except ValueError:  # not the main thread: the caller has to stop us another way
            pass
    try:
        print(f"llama-swap simulator listening on {sim.url}", flush=True)
        while not stop.wait(0.5):
            pass
    finally:
        sim.stop()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
