"""The simulator's run time for a request of a given size, for the models that opt in.

A model's run seconds (``--model NAME=SECONDS``, ``metadata.simulator.seconds`` or
``--default-seconds``) are for a reference request; a request of a model that scales
with size (``--size-scaled``, or ``metadata.simulator.size_scaled: true`` in a config)
runs those seconds times each of its size's factors over the reference's:

  video (an image or sdapi body naming ``num_frames``, ``frames``, ``video_frames`` or
  ``video_length``): × frames / 60 × steps / 20 × pixels / (832 × 480)
  image (``/v1/images/*``, ``/sdapi/v1/*``): × count / 1 × pixels / 1024² × steps / 20,
  the count being ``n``, or sdapi's ``batch_size`` × ``n_iter``
  chat, completion, responses: × max tokens / 256 (``max_completion_tokens``,
  ``max_tokens``, ``max_output_tokens``)
  speech: × characters of ``input`` / 200
  transcription: × bytes of the upload / 1,000,000
  embeddings: × characters of ``input`` (a string or a list of strings) / 2,000

Steps are ``steps``, ``num_inference_steps``, ``sample_steps`` or ``infer_steps``; pixels
are ``width`` × ``height`` or ``size`` "1280x720" / "1280*720". A factor the body does not
give (or gives as anything but a positive number) is the reference's, so a body without
size fields runs the model's seconds exactly; ``"sim": {"seconds": N}`` wins over all of
it. The product is capped at `MAX_SCALE` times the model's seconds.

This is written apart from `queueapp.policy.request_size` on purpose (it must not import
it): the estimates are tested against this rule as an independent truth.
"""

from __future__ import annotations

import math
import re
from typing import Any

REFERENCE_VIDEO_FRAMES = 60
REFERENCE_STEPS = 20
REFERENCE_VIDEO_PIXELS = 832 * 480
REFERENCE_IMAGE_PIXELS = 1024 * 1024
REFERENCE_MAX_TOKENS = 256
REFERENCE_SPEECH_CHARACTERS = 200
REFERENCE_UPLOAD_BYTES = 1_000_000
REFERENCE_EMBEDDING_CHARACTERS = 2000
MAX_SCALE = 10_000.0

FRAME_KEYS = ("num_frames", "frames", "video_frames", "video_length")
STEP_KEYS = ("steps", "num_inference_steps", "sample_steps", "infer_steps")
TOKEN_KEYS = ("max_completion_tokens", "max_tokens", "max_output_tokens")
_SIZE = re.compile(r"(\d{1,6})[x*](\d{1,6})")


def sized_seconds(kind: str, seconds: float, body: Any, *, body_bytes: int) -> float:
    """``seconds`` scaled by the size of a request of ``kind`` (routes.MODEL_ROUTES)."""
    fields = body if isinstance(body, dict) else {}
    scale = _scale(kind, fields, body_bytes)
    return seconds * min(scale, MAX_SCALE)


def _scale(kind: str, body: dict[str, Any], body_bytes: int) -> float:
    if kind in ("image", "sdapi") and _first(body, FRAME_KEYS) is not None:
        return (
            _ratio(_first(body, FRAME_KEYS), REFERENCE_VIDEO_FRAMES)
            * _ratio(_first(body, STEP_KEYS), REFERENCE_STEPS)
            * _ratio(_pixels(body), REFERENCE_VIDEO_PIXELS)
        )
    if kind in ("image", "sdapi"):
        return (
            _ratio(_count(kind, body), 1)
            * _ratio(_pixels(body), REFERENCE_IMAGE_PIXELS)
            * _ratio(_first(body, STEP_KEYS), REFERENCE_STEPS)
        )
    if kind in ("chat", "completion", "responses"):
        return _ratio(_first(body, TOKEN_KEYS), REFERENCE_MAX_TOKENS)
    if kind == "speech":
        text = body.get("input")
        return _ratio(len(text) if isinstance(text, str) else None, REFERENCE_SPEECH_CHARACTERS)
    if kind == "transcription":
        return _ratio(body_bytes, REFERENCE_UPLOAD_BYTES)
    if kind == "embeddings":
        return _ratio(_characters(body.get("input")), REFERENCE_EMBEDDING_CHARACTERS)
    return 1.0


def _positive(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, int) and value.bit_length() > 64:
        return None
    number = float(value)
    return number if math.isfinite(number) and number > 0 else None


def _ratio(value: Any, reference: float) -> float:
    """``value`` over its reference; 1 when the body did not give it."""
    number = _positive(value)
    return 1.0 if number is None else number / reference


def _first(body: dict[str, Any], keys: tuple[str, ...]) -> float | None:
    for key in keys:
        number = _positive(body.get(key))
        if number is not None:
            return number
    return None


def _pixels(body: dict[str, Any]) -> float | None:
    width, height = _positive(body.get("width")), _positive(body.get("height"))
    if width is not None and height is not None:
        return width * height
    size = body.get("size")
    match = _SIZE.fullmatch(size) if isinstance(size, str) else None
    return int(match[1]) * int(match[2]) if match else None


def _count(kind: str, body: dict[str, Any]) -> float | None:
    if kind == "image":
        return _positive(body.get("n"))
    batch, iterations = _positive(body.get("batch_size")), _positive(body.get("n_iter"))
    if batch is None and iterations is None:
        return None
    return (batch or 1.0) * (iterations or 1.0)


def _characters(value: Any) -> int | None:
    if isinstance(value, str):
        return len(value)
    if isinstance(value, list):
        return sum(len(item) for item in value if isinstance(item, str)) or None
    return None
