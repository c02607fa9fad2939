"""The simulator's answers: small, deterministic stand-ins for what a backend returns.

Each has the shape the OpenAI-compatible backends behind llama-swap answer with (chat,
completion, responses, transcription, embeddings, images, speech) or AUTOMATIC1111's for
``/sdapi/v1/*``, so a client parses them as it would a real answer. The content is fixed
or derived from the request (an embedding from a hash of its input), so two runs give the
same bytes and a test can compare a relayed answer with the one sent.
"""

from __future__ import annotations

import base64
import hashlib
import html
import io
import json
import struct
import wave
import zlib
from typing import Any

# Answers with a text field: padding to a requested size goes into that text.
TEXT_KINDS = ("chat", "completion", "responses", "transcription")


def dumps(obj: Any) -> bytes:
    """Compact JSON, as llama-swap's Go backends write it."""
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


def silent_wav(min_bytes: int = 0) -> bytes:
    """The speech answer: silence, at least ``min_bytes`` long."""
    frames = max(800, (min_bytes - 44 + 1) // 2)  # 16-bit mono; 44-byte RIFF header
    buf = io.BytesIO()
    with wave.open(buf, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(8000)
        out.writeframes(b"\x00\x00" * frames)
    return buf.getvalue()


def reply_text(model: str, n: int) -> str:
    """The text of answer number ``n``: numbered, so two answers never look alike."""
    return f"Simulated reply #{n} from {model}: the quick brown fox jumps over the lazy dog."


def _token_estimate(body: Any) -> int:
    if not isinstance(body, dict):
        return 0
    source = body.get("messages") or body.get("prompt") or body.get("input") or ""
    return len(json.dumps(source).split())


def _embedding(model: str, text: str) -> list[float]:
    digest = hashlib.sha256(f"{model}\0{text}".encode()).digest()
    return [round(byte / 255 * 2 - 1, 6) for byte in digest[:8]]


def render_answer(kind: str, model: str, n: int, body: Any, text: str, now: int) -> dict[str, Any]:
    """The JSON answer of a route of ``kind`` (see ``server.MODEL_ROUTES``)."""
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
        output: dict[str, Any] = {"type": "message", "id": f"msg_sim_{n}", "status": "completed"}
        output.update(role="assistant", content=[part])
        tokens = {"input_tokens": prompt, "output_tokens": words, "total_tokens": prompt + words}
        response: dict[str, Any] = {"id": f"resp_sim_{n}", "object": "response", "created_at": now}
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


def render_sized(kind: str, model: str, n: int, body: Any, now: int, size: int) -> bytes:
    """The encoded answer, padded to at least ``size`` bytes (the ``sim.size_bytes`` option):
    in the text where the answer has one, otherwise in a top-level ``"sim_padding"``."""
    text = reply_text(model, n)
    encoded = dumps(render_answer(kind, model, n, body, text, now))
    deficit = size - len(encoded)
    if deficit <= 0:
        return encoded
    if kind in TEXT_KINDS:
        return dumps(render_answer(kind, model, n, body, text + " " + "x" * deficit, now))
    padded = render_answer(kind, model, n, body, text, now)
    padded["sim_padding"] = "x" * deficit
    return dumps(padded)


def stream_events(
    kind: str, model: str, n: int, body: dict[str, Any], now: int, size: int
) -> list[dict[str, Any]]:
    """The server-sent events of a streamed chat or completion answer, in order, before
    ``[DONE]``: a role delta (chat), the text in four pieces, the finish, and the usage
    when ``stream_options.include_usage`` asks for it."""
    text = reply_text(model, n)
    if size > len(text):
        text += " " + "x" * (size - len(text))
    pieces = [text[i * len(text) // 4 : (i + 1) * len(text) // 4] for i in range(4)]
    base: dict[str, Any]
    choices: list[dict[str, Any]]
    if kind == "chat":
        base = {"id": f"chatcmpl-sim-{n}", "object": "chat.completion.chunk"}
        deltas: list[dict[str, str]] = [{"role": "assistant", "content": ""}]
        deltas += [{"content": p} for p in pieces]
        choices = [{"index": 0, "delta": d, "finish_reason": None} for d in deltas]
        choices.append({"index": 0, "delta": {}, "finish_reason": "stop"})
    else:
        base = {"id": f"cmpl-sim-{n}", "object": "text_completion"}
        choices = [{"index": 0, "text": p, "logprobs": None, "finish_reason": None} for p in pieces]
        choices.append({"index": 0, "text": "", "logprobs": None, "finish_reason": "stop"})
    events: list[dict[str, Any]] = [
        {**base, "created": now, "model": model, "choices": [choice]} for choice in choices
    ]
    stream_options = body.get("stream_options")
    if isinstance(stream_options, dict) and stream_options.get("include_usage"):
        usage = render_answer(kind, model, n, body, text, now)["usage"]
        events.append({**base, "created": now, "model": model, "choices": [], "usage": usage})
    return events


def server_page(model: str) -> bytes:
    """What a model's server answers at ``/`` (llama-server serves its web page there)."""
    name = html.escape(model)
    return f"<!doctype html><title>{name}</title><p>{name} is loaded.</p>\n".encode()


def server_props(model: str, slots: int) -> bytes:
    """What a model's server answers at ``/props``: llama-server's shape
    (tools/server/server.cpp, the props handler), the fields a client reads;
    ``total_slots`` is how many requests it answers at once."""
    props = {
        "default_generation_settings": {"n_ctx": 4096, "params": {}},
        "total_slots": slots,
        "model_alias": model,
        "model_path": f"/models/{model}.gguf",
        "chat_template": "",
        "build_info": "gpusched simulator",
    }
    return json.dumps(props).encode()
