"""How big a request is, read from its body: the size that a job's run time follows.

A job's run time varies by an order of magnitude within one model (a 360-frame video
takes four times a 60-frame one; an image follows pixels × steps × count; a chat follows
its output budget and its prompt), so the estimates fit run seconds against this size
per model and path. `request_size` reads the size; it knows no model and no history.

What each path's size is, and the fields it is read from:

* **Images**, ``/v1/images/generations`` and ``/v1/images/edits`` (OpenAI's fields ``n``
  and ``size`` "1024x1024", plus ``steps`` / ``num_inference_steps`` / ``sample_steps``
  that stable-diffusion.cpp's sd-server and diffusers-based servers accept), and
  ``/sdapi/v1/txt2img`` / ``img2img`` (AUTOMATIC1111, Forge and sd-server's sdapi:
  ``batch_size`` × ``n_iter``, ``width``, ``height``, ``steps``): count × megapixels ×
  steps. A missing factor takes its default: 1 image, 1024×1024 for OpenAI's paths and
  512×512 for sdapi (each API's own default), 20 steps. A body with none of the fields
  has no size (None): a default alone says nothing about this request.
* **Video**. llama-swap routes no video path of its own, so a video server behind it
  (a Wan 2.x, HunyuanVideo or LTX-Video wrapper, sd-server running Wan) takes its
  requests on the image paths above; a body there that names a frame count is a video.
  OpenAI's ``/v1/videos`` (Sora's API: ``seconds`` as a string, ``size``) is read too.
  Frames: ``num_frames`` (diffusers, LTX-Video, HunyuanVideo servers), ``frames``,
  ``video_frames`` (sd-server), ``video_length`` (HunyuanVideo), ``length`` (ComfyUI's
  latent video nodes), ``frame_num`` (Wan's generate.py), else ``seconds`` /
  ``duration`` × ``fps`` (``/v1/videos`` only assumes 16 fps, Wan's rate, when no
  ``fps`` is given; on an image path a duration without ``fps`` is not read). Steps:
  ``num_inference_steps``, ``steps``, ``sample_steps`` (Wan), ``infer_steps``
  (HunyuanVideo). Pixels:
  ``width`` / ``height``, ``size`` as "1280x720" or "1280*720" (Wan's form), or
  ``resolution`` as such a string or "720p". Defaults: 81 frames, 50 steps, 832×480
  (Wan 2.1's). The size is frames × steps × megapixels.
* **Chat**, ``/v1/chat/completions``: ``max_completion_tokens`` or ``max_tokens`` plus
  the prompt's tokens over `PREFILL_RATIO` (reading the prompt costs a fraction of
  writing as many tokens). The prompt's tokens are its characters over
  `CHARACTERS_PER_TOKEN`: every text of every message (``content`` a string or a list
  of parts), each image part counted as `IMAGE_PROMPT_TOKENS`, whatever its base64
  length. Without a token limit there is no size: the output may be any length, so the
  estimate falls back to the model's mean. ``/v1/responses`` reads
  ``max_output_tokens``, ``instructions`` and ``input`` the same way, and
  ``/v1/completions`` ``max_tokens`` and ``prompt`` (a string, a list of them, or token
  ids, one token each).
* **Speech**, ``/v1/audio/speech``: the characters of ``input``.
* **Transcriptions** and translations: ``body_bytes``, the upload's size (the body is a
  multipart form, not parsed here).
* **Embeddings**, ``/v1/embeddings``: the characters of ``input`` (a string, a list of
  them, token ids at `CHARACTERS_PER_TOKEN` each); reranking (``/v1/rerank``,
  ``/rerank``): ``query`` and ``documents`` (strings, or objects with a ``text``).

Anything else, or a body that is not an object, has no size. The function never raises:
a field of the wrong type, negative, not finite or past its bound is ignored (its default
stands in, or there is no size), a walk over parts stops after `MAX_PARTS`, and the value
is clamped to [`MIN_SIZE`, `MAX_SIZE`].
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class SizeKind(StrEnum):
    """What a size counts; a `str`, so it is stored and compared as its value."""

    IMAGE = "image"  # count × megapixels × steps
    VIDEO = "video"  # frames × steps × megapixels
    TOKENS = "tokens"  # output tokens + prompt tokens / PREFILL_RATIO
    CHARACTERS = "characters"
    BYTES = "bytes"


MIN_SIZE = 1e-6
MAX_SIZE = 1e12
MAX_PARTS = 4096  # messages, parts, inputs or documents read from one body, at most
CHARACTERS_PER_TOKEN = 4
PREFILL_RATIO = 20  # prompt tokens read in the time of one generated token
IMAGE_PROMPT_TOKENS = 1000  # one image in a vision chat, as prompt tokens

# (count, width, height, steps) for a field a body leaves out.
OPENAI_IMAGE_DEFAULTS = (1, 1024, 1024, 20)
SDAPI_IMAGE_DEFAULTS = (1, 512, 512, 20)
VIDEO_DEFAULT_FRAMES = 81
VIDEO_DEFAULT_STEPS = 50
VIDEO_DEFAULT_PIXELS = (832, 480)
VIDEO_DEFAULT_FPS = 16

# Bounds past which a field is nonsense, not a large request.
MAX_COUNT = 1000
MAX_SIDE = 65536
MAX_STEPS = 10000
MAX_FRAMES = 100000
MAX_TOKENS = 10**8
MAX_VIDEO_SECONDS = 3600

OPENAI_IMAGE_PATHS = ("/v1/images/generations", "/v1/images/edits")
SDAPI_PATHS = ("/sdapi/v1/txt2img", "/sdapi/v1/img2img")
VIDEO_PATHS = ("/v1/videos",)
EMBEDDING_PATHS = ("/v1/embeddings",)
RERANK_PATHS = ("/v1/rerank", "/rerank", "/v1/reranking", "/reranking")
TRANSCRIPTION_PATHS = ("/v1/audio/transcriptions", "/v1/audio/translations")

FRAME_FIELDS = ("num_frames", "frames", "video_frames", "video_length", "length", "frame_num")
STEP_FIELDS = ("num_inference_steps", "steps", "sample_steps", "infer_steps")
IMAGE_PART_TYPES = ("image_url", "input_image", "image")
_DIMENSIONS = re.compile(r"\s*(\d{1,6})\s*[x×*X]\s*(\d{1,6})\s*")
_NAMED_RESOLUTIONS = {"480p": (832, 480), "540p": (960, 540), "720p": (1280, 720)}
_NAMED_RESOLUTIONS["1080p"] = (1920, 1080)


@dataclass(frozen=True)
class RequestSize:
    value: float  # what the fit uses; finite, in [MIN_SIZE, MAX_SIZE]
    kind: str  # a SizeKind
    text: str  # how `why` names it: "362 frames, 30 steps, 1280×720"


def request_size(path: str, body: object, *, body_bytes: int | None = None) -> RequestSize | None:
    """The size of a request to ``path`` with ``body`` (the module says how each path's is
    read); None when the path has no size rule or the body says nothing of its size."""
    try:
        if path in TRANSCRIPTION_PATHS:
            return _upload_size(body_bytes)
        if not isinstance(body, dict):
            return None
        return _body_size(path, body)
    except (ArithmeticError, ValueError, TypeError, RecursionError):
        return None  # a guard: the readers below are written not to raise


def _body_size(path: str, body: dict[str, Any]) -> RequestSize | None:
    if path in VIDEO_PATHS:
        return _video_size(body, video_path=True)
    if path in OPENAI_IMAGE_PATHS or path in SDAPI_PATHS:
        return _video_size(body, video_path=False) or _image_size(path, body)
    if path == "/v1/chat/completions":
        limit = _first_number(body, ("max_completion_tokens", "max_tokens"), MAX_TOKENS)
        return _token_size(limit, _message_prompt(body.get("messages")))
    if path == "/v1/responses":
        limit = _first_number(body, ("max_output_tokens",), MAX_TOKENS)
        prompt = _message_prompt(body.get("input")).plus(_text_prompt(body.get("instructions")))
        return _token_size(limit, prompt)
    if path == "/v1/completions":
        limit = _first_number(body, ("max_tokens",), MAX_TOKENS)
        return _token_size(limit, _text_prompt(body.get("prompt")))
    if path == "/v1/audio/speech":
        text = body.get("input")
        return _character_size(len(text), None) if isinstance(text, str) and text else None
    if path in EMBEDDING_PATHS:
        prompt = _text_prompt(body.get("input"))
        return _character_size(prompt.characters, prompt.parts) if prompt.parts else None
    if path in RERANK_PATHS:
        prompt = _text_prompt(body.get("query")).plus(_text_prompt(body.get("documents")))
        return _character_size(prompt.characters, prompt.parts) if prompt.parts else None
    return None


# -- numbers --------------------------------------------------------------------------------


def _number(value: Any, upper: float) -> float | None:
    """``value`` when it is a real number in (0, upper]; booleans and strings are not."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, int) and value.bit_length() > 64:
        return None  # float() of a huge int raises
    number = float(value)
    return number if math.isfinite(number) and 0 < number <= upper else None


def _first_number(body: dict[str, Any], fields: Iterable[str], upper: float) -> float | None:
    for field in fields:
        number = _number(body.get(field), upper)
        if number is not None:
            return number
    return None


def _clamped(value: float) -> float:
    return min(max(value, MIN_SIZE), MAX_SIZE) if math.isfinite(value) else MAX_SIZE


def _grouped(number: float) -> str:
    """1024 -> "1,024"; 2.5 -> "2.5"."""
    return f"{number:,.0f}" if number == int(number) else f"{number:,.3g}"


def _plural(number: float, noun: str) -> str:
    return f"{_grouped(number)} {noun}{'' if number == 1 else 's'}"


# -- pictures -------------------------------------------------------------------------------


def _dimensions(value: Any) -> tuple[int, int] | None:
    """ "1280x720", "1280*720", "720p" or [1280, 720]; None for anything else."""
    if isinstance(value, str) and len(value) <= 32:
        named = _NAMED_RESOLUTIONS.get(value.strip().lower())
        if named:
            return named
        match = _DIMENSIONS.fullmatch(value)
        if match:
            width, height = int(match[1]), int(match[2])
            return (width, height) if 0 < width <= MAX_SIDE and 0 < height <= MAX_SIDE else None
    if isinstance(value, list) and len(value) == 2:
        across, down = _number(value[0], MAX_SIDE), _number(value[1], MAX_SIDE)
        return (int(across), int(down)) if across and down and min(across, down) >= 1 else None
    return None


def _pixels(body: dict[str, Any], default: tuple[int, int]) -> tuple[tuple[int, int], bool]:
    """(width, height) the body asks for, and whether it asked (not the default)."""
    width, height = _number(body.get("width"), MAX_SIDE), _number(body.get("height"), MAX_SIDE)
    if width and height and min(width, height) >= 1:
        return (int(width), int(height)), True
    for field in ("size", "resolution"):
        found = _dimensions(body.get(field))
        if found:
            return found, True
    return default, False


def _image_size(path: str, body: dict[str, Any]) -> RequestSize | None:
    sdapi = path in SDAPI_PATHS
    default_count, *default_pixels, default_steps = (
        SDAPI_IMAGE_DEFAULTS if sdapi else OPENAI_IMAGE_DEFAULTS
    )
    if sdapi:
        batch = _number(body.get("batch_size"), MAX_COUNT)
        iterations = _number(body.get("n_iter"), MAX_COUNT)
        count = (batch or 1) * (iterations or 1) if batch or iterations else None
    else:
        count = _number(body.get("n"), MAX_COUNT)
    steps = _first_number(body, STEP_FIELDS, MAX_STEPS)
    (width, height), pixels_given = _pixels(body, (default_pixels[0], default_pixels[1]))
    if count is None and steps is None and not pixels_given:
        return None
    count = int(count) if count and count >= 1 else default_count
    steps_given = bool(steps and steps >= 1)
    steps = int(steps) if steps and steps >= 1 else default_steps
    value = count * (width * height / 1e6) * steps
    text = ", ".join(
        (
            _plural(count, "image"),
            f"{width}×{height}" + ("" if pixels_given else " (default)"),
            _plural(steps, "step") + ("" if steps_given else " (default)"),
        )
    )
    return RequestSize(value=_clamped(value), kind=SizeKind.IMAGE, text=text)


def _frames(body: dict[str, Any], *, video_path: bool) -> tuple[float | None, str]:
    """The frame count the body asks for, and how `why` says where it came from. On an
    image path a duration counts only beside an ``fps``: alone it may mean anything."""
    frames = _first_number(body, FRAME_FIELDS, MAX_FRAMES)
    if frames is not None:
        return frames, ""
    if not video_path and _number(body.get("fps"), 240) is None:
        return None, ""
    seconds = _first_number(body, ("seconds", "duration"), MAX_VIDEO_SECONDS)
    if seconds is None and isinstance(body.get("seconds"), str):
        text = body["seconds"].strip()  # Sora's API sends "4", "8", "12"
        if text.isdigit() and len(text) <= 4:
            seconds = _number(int(text), MAX_VIDEO_SECONDS)
    if seconds is None:
        return None, ""
    fps = _number(body.get("fps"), 240) or VIDEO_DEFAULT_FPS
    return seconds * fps, f" ({_grouped(seconds)} s at {_grouped(fps)} fps)"


def _video_size(body: dict[str, Any], *, video_path: bool) -> RequestSize | None:
    """A video's size; None for a body that names no frames unless the path is a video's."""
    frames, how = _frames(body, video_path=video_path)
    if frames is None and not video_path:
        return None
    if frames is None or frames < 1:
        frames, how = VIDEO_DEFAULT_FRAMES, " (default)"
    steps = _first_number(body, STEP_FIELDS, MAX_STEPS)
    steps_text = "" if steps and steps >= 1 else " (default)"
    steps = int(steps) if steps and steps >= 1 else VIDEO_DEFAULT_STEPS
    (width, height), pixels_given = _pixels(body, VIDEO_DEFAULT_PIXELS)
    value = int(frames) * steps * (width * height / 1e6)
    text = ", ".join(
        (
            f"{_plural(int(frames), 'frame')}{how}",
            f"{_plural(steps, 'step')}{steps_text}",
            f"{width}×{height}" + ("" if pixels_given else " (default)"),
        )
    )
    return RequestSize(value=_clamped(value), kind=SizeKind.VIDEO, text=text)


# -- text -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Prompt:
    characters: int = 0
    images: int = 0
    parts: int = 0  # texts (and token-id lists) found

    def plus(self, other: _Prompt) -> _Prompt:
        return _Prompt(
            self.characters + other.characters, self.images + other.images, self.parts + other.parts
        )

    @property
    def tokens(self) -> float:
        return self.characters / CHARACTERS_PER_TOKEN + self.images * IMAGE_PROMPT_TOKENS


def _text_prompt(value: Any) -> _Prompt:
    """A prompt, an input or documents: a string, token ids, or a list of either (or of
    objects with a ``text``); at most `MAX_PARTS` items read, no deeper than that."""
    if isinstance(value, str):
        return _Prompt(characters=len(value), parts=1)
    if not isinstance(value, list):
        return _Prompt()
    if value and all(_is_token(item) for item in value[:MAX_PARTS]):
        return _Prompt(characters=min(len(value), MAX_PARTS) * CHARACTERS_PER_TOKEN, parts=1)
    characters = parts = 0
    for item in value[:MAX_PARTS]:
        if isinstance(item, dict):
            item = item.get("text")
        if isinstance(item, str):
            characters, parts = characters + len(item), parts + 1
        elif isinstance(item, list) and all(_is_token(token) for token in item[:MAX_PARTS]):
            characters += min(len(item), MAX_PARTS) * CHARACTERS_PER_TOKEN
            parts += 1
    return _Prompt(characters=characters, parts=parts)


def _is_token(item: Any) -> bool:
    return isinstance(item, int) and not isinstance(item, bool)


def _message_prompt(messages: Any) -> _Prompt:
    """Every text of every message, and the images among their parts; `MAX_PARTS` read."""
    if isinstance(messages, str):
        return _Prompt(characters=len(messages), parts=1)  # /v1/responses' input
    if not isinstance(messages, list):
        return _Prompt()
    characters = images = parts = 0
    for message in messages[:MAX_PARTS]:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            content = [content]
        for part in content[: MAX_PARTS - parts] if isinstance(content, list) else ():
            parts += 1
            if isinstance(part, dict):
                part = part.get("text") if isinstance(part.get("text"), str) else part
            if isinstance(part, str):
                characters += len(part)
            elif isinstance(part, dict) and part.get("type") in IMAGE_PART_TYPES:
                images += 1
        if parts >= MAX_PARTS:
            break
    return _Prompt(characters, images, parts)


def _token_size(limit: float | None, prompt: _Prompt) -> RequestSize | None:
    if limit is None:
        return None
    value = limit + prompt.tokens / PREFILL_RATIO
    text = f"{_grouped(int(limit))} max tokens, a {_grouped(prompt.characters)}-character prompt"
    if prompt.images:
        text += f" and {_plural(prompt.images, 'image')}"
    return RequestSize(value=_clamped(value), kind=SizeKind.TOKENS, text=text)


def _character_size(characters: int, inputs: int | None) -> RequestSize | None:
    if characters <= 0:
        return None
    text = f"{_grouped(characters)} characters"
    if inputs is not None:
        text += f" in {_plural(inputs, 'input')}"
    return RequestSize(value=_clamped(float(characters)), kind=SizeKind.CHARACTERS, text=text)


def _upload_size(body_bytes: Any) -> RequestSize | None:
    size = _number(body_bytes, MAX_SIZE)
    if size is None:
        return None
    return RequestSize(
        value=_clamped(size), kind=SizeKind.BYTES, text=f"a {size / 1e6:,.1f} MB upload"
    )
