"""llama-swap's HTTP surface as data: the routes that take a model (a JSON body
or a form) and those read by GET, the kinds of answer, llama-swap's messages
and its JSON error envelope (internal/swaputil/httperror.go), and the
simulator-only ``"sim"`` body key. `server` serves them."""

from __future__ import annotations

from typing import Any

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
GET_ROUTES = ("/running", "/v1/models", "/models", "/health", "/unload", "/api/events", "/sim/log")
POST_ROUTES = ("/api/models/unload", "/sim/reset")
# POST /api/models/unload/{model...}: the rest of the path is the model, slashes and all.
UNLOAD_MODEL_PREFIX = "/api/models/unload/"
# llama-swap's passthrough to a model's own server; a GET of its root loads the model.
UPSTREAM_PREFIX = "/upstream/"
STREAMING_KINDS = ("chat", "completion")
# Servers that finish a render whose client hung up (image, audio, video
# servers); llama-server, behind the other kinds, stops generating at once.
RENDERING_KINDS = ("image", "speech", "transcription", "sdapi")

MSG_NO_MODEL = "no model id could be identified"
MSG_UNKNOWN_MODEL = "no router for requested model"
MSG_MODEL_NOT_FOUND = "model not found"  # /upstream/<model>/ and the unload of a model
# What a request waiting for its model's load gets when an unload stops that model: the
# scheduler's error (internal/router/scheduler/fifo.go OnUnload, router "group") through
# swaputil.SendError's default case, a 500.
MSG_LOAD_UNLOADED = "unspecific error: group: model unloaded"
MSG_BUSY = "Too many requests"
MSG_SIMULATED = "simulated upstream error"
STATUS_CLIENT_GONE = 499  # logged only: the client hung up before the answer was complete

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


def sim_options(body: Any) -> dict[str, Any]:
    """The simulator-only ``"sim"`` body key, checked; ValueError says what is wrong."""
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
