"""What a job body must be before it is stored: JSON that PostgreSQL's `jsonb`
accepts, nested no deeper than any llama-swap request needs.

PostgreSQL refuses the NUL character and unpaired UTF-16 surrogates in
`jsonb` (JSON text may carry both as escapes, and Python's parser keeps
them), and deep nesting costs stack in every program that reads the body
again (the database, the renderer, the dispatcher). Both are caught here,
as a clear 400, instead of as a database error.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

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
    return None


MAX_MODEL_NAME = 200
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
