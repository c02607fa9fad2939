"""What a request must be before its job is stored, one definition of each
limit that both doors use (the REST API's inputs and the OpenAI front door):
the model's name, the job's path, the body's size by path, and a body that
PostgreSQL's `jsonb` accepts, nested no deeper than any llama-swap request
needs. The columns are sized from the same constants (queueapp/models/),
so a value that passes here always fits its column.

PostgreSQL refuses in `jsonb` the NUL character and unpaired UTF-16
surrogates (JSON text may carry both as escapes, and Python's parser keeps
them) and numbers that are not finite (Python's parser reads NaN, Infinity
and 1e400 as such), and deep nesting costs stack in every program that
reads the body again (the database, the renderer, the dispatcher). All are
caught here, as a clear 400, instead of as a database error.
"""

from __future__ import annotations

import math
import re
import unicodedata
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from queueapp.upstream.client import FRONT_DOOR_ONLY_PATHS, PRELOAD_PATH_PREFIX

MAX_BODY_DEPTH = 64
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def body_problem(body: Any, *, max_depth: int = MAX_BODY_DEPTH) -> str | None:
    """Why `body` cannot be stored, or None. Walks without recursion, so any
    depth is safe to check."""
    pending: list[tuple[Any, int]] = [(body, 1)]
    while pending:
        value, depth = pending.pop()
        if isinstance(value, dict):
            if depth > max_depth:
                return f"nested deeper than {max_depth} levels"
            for key, item in value.items():
                if isinstance(key, str) and _UNSTORABLE.search(key):
                    return _unstorable(key)
                pending.append((item, depth + 1))
        elif isinstance(value, list):
            if depth > max_depth:
                return f"nested deeper than {max_depth} levels"
            pending.extend((item, depth + 1) for item in value)
        elif isinstance(value, str) and _UNSTORABLE.search(value):
            return _unstorable(value)
        elif isinstance(value, float) and not math.isfinite(value):
            return (
                f"contains the number {value}, which cannot be stored (NaN, Infinity "
                "or past ±1.8e308)"
            )
    return None


MAX_MODEL_NAME = 200
MAX_CHAIN_ID = 200
MAX_CALLBACK_URL = 2000
MAX_GPU_NAME = 64  # a preload's `gpu`, a job's pin: a GPU's name
# The longest path a job may have: a preload's `/upstream/<model>/`
# (upstream.client.preload_path); every other path is one of a fixed list.
MAX_JOB_PATH = len(PRELOAD_PATH_PREFIX) + MAX_MODEL_NAME + 1
# The same rule as the OpenAPI schema's pattern for `body.model`: no control
# character, and at least one character that is not a space.
MODEL_NAME_PATTERN = (
    r"^[^\u0000-\u001f\u007f-\u009f]*[^\s\u0000-\u001f\u007f-\u009f]"
    r"[^\u0000-\u001f\u007f-\u009f]*$"
)


def model_name_problem(model: Any) -> str | None:
    """Why `model` cannot name the model llama-swap should run, or None."""
    if not isinstance(model, str) or not model:
        return "required: the name of the model llama-swap should run"
    if any(unicodedata.category(character) == "Cc" for character in model):
        return "contains a control character"
    if model.isspace():
        return "required: the name of the model llama-swap should run (not only spaces)"
    if len(model) > MAX_MODEL_NAME:
        return f"longer than {MAX_MODEL_NAME} characters"
    return None


def _unstorable(text: str) -> str:
    found = _UNSTORABLE.search(text)
    assert found is not None
    if found.group() == "\x00":
        return "contains the NUL character (\\u0000), which cannot be stored"
    return f"contains an unpaired surrogate (\\u{ord(found.group()):04x}), which is not Unicode"


@dataclass(frozen=True)
class BodyLimit:
    """The most bytes a request body may have, and the setting that raises it."""

    bytes: int
    setting: str

    def refusal(self, size: int, path: str) -> str:
        return (
            f"the request body is {size} bytes; the limit for {path} is {self.bytes} bytes "
            f"({self.setting} raises it)"
        )


# The front door's multipart paths: an audio file or an image to edit.
UPLOAD_PATHS = (*FRONT_DOOR_ONLY_PATHS, "/v1/images/edits")


def front_door_body_limit(path: str) -> BodyLimit:
    """How large a front-door body on `path` may be. The body stays in the
    waiting call's memory and goes to llama-swap as it came; only a summary
    is stored (`stored_summary`), so it may be far larger than a REST job's,
    whose body the jobs table holds and the dispatcher reads back."""
    if path in UPLOAD_PATHS:
        return BodyLimit(
            settings.GPUSCHED_FRONT_DOOR_MAX_UPLOAD_BYTES, "GPUSCHED_FRONT_DOOR_MAX_UPLOAD_BYTES"
        )
    return BodyLimit(
        settings.GPUSCHED_FRONT_DOOR_MAX_BODY_BYTES, "GPUSCHED_FRONT_DOOR_MAX_BODY_BYTES"
    )


def rest_body_limit() -> BodyLimit:
    """How large a REST job's `body` may be: it is stored in the jobs table."""
    return BodyLimit(settings.GPUSCHED_MAX_BODY_BYTES, "GPUSCHED_MAX_BODY_BYTES")


# What a REST request may hold around its job's `body` (path, callback,
# chain, priority): the request as a whole may be this much larger.
REST_ENVELOPE_BYTES = 64 * 1024


# A front-door body's strings longer than this are not stored (a base64
# image, a long document); the summary says how long each was.
STORED_STRING_CHARS = 1000


def stored_summary(body: Any, *, max_chars: int = STORED_STRING_CHARS) -> Any:
    """`body` as a front-door job stores it: the same JSON with every string
    longer than `max_chars` replaced by a note of its length, so the job
    shows what was asked (model, messages, max_tokens) without holding the
    megabytes a vision chat carries. Walks without recursion."""

    def short(value: Any) -> Any:
        if isinstance(value, str) and len(value) > max_chars:
            return f"[{len(value)} characters, not stored]"
        return value

    root = [short(body)]
    pending: list[Any] = [root]
    while pending:
        container = pending.pop()
        keys = container.keys() if isinstance(container, dict) else range(len(container))
        for key in keys:
            item = container[key]
            if isinstance(item, dict):
                item = container[key] = dict(item)
                pending.append(item)
            elif isinstance(item, list):
                item = container[key] = list(item)
                pending.append(item)
            else:
                container[key] = short(item)
    return root[0]
