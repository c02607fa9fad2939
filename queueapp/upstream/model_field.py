"""How llama-swap finds the model of a request: standard library only, shared by
the OpenAI front door and the simulator (which runs without Django)."""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import parse_qs


def _multipart_fields(content_type: str, raw: bytes) -> dict[str, list[str]]:
    # Files are skipped: Go's FormValue, which llama-swap uses, only sees value fields.
    match = re.search(r'boundary="?([^";]+)"?', content_type)
    fields: dict[str, list[str]] = {}
    if not match:
        return fields
    for part in raw.split(b"--" + match.group(1).encode()):
        head, sep, value = part.partition(b"\r\n\r\n")
        disposition = re.search(rb"(?im)^content-disposition:.*$", head) if sep else None
        if not disposition or b"filename=" in disposition.group(0):
            continue
        name = re.search(rb';\s*name="([^"]*)"', disposition.group(0))
        if name:
            value = value[:-2] if value.endswith(b"\r\n") else value
            field = name.group(1).decode("utf-8", "replace")
            fields.setdefault(field, []).append(value.decode("utf-8", "replace"))
    return fields


def extract_model(content_type: str, raw: bytes, query: str = "") -> tuple[str, Any]:
    """Return ``(model, parsed JSON body or None)`` the way llama-swap picks the model.

    JSON bodies are only read when the Content-Type says JSON; everything else goes through
    form parsing, where the URL query also counts. Unparsable JSON yields no model.
    """
    if "application/json" in content_type:
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError):  # RecursionError: nested past the parser's depth
            return "", None
        model = body.get("model") if isinstance(body, dict) else None
        return (model if isinstance(model, str) else ""), body
    if "multipart/form-data" in content_type:
        fields = _multipart_fields(content_type, raw)
    elif "application/x-www-form-urlencoded" in content_type:
        fields = parse_qs(raw.decode("utf-8", "replace"))
    else:
        fields = {}
    values = fields.get("model", []) + parse_qs(query).get("model", [])
    return (values[0] if values else ""), None
