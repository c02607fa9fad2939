"""The fuzz's deadline for one front-door call, and what OpenAI's error
object must be. Calls go through tests/frontdoor/client.py's
`front_door_call`, with raw header bytes and that deadline."""

from __future__ import annotations

import json
from typing import Any

import httpx

# A call with a zero-second model ends in well under a second; past this it
# counts as hung (and is cancelled, as a caller hanging up would).
CALL_DEADLINE_SECONDS = 15.0


def openai_error_problem(response: httpx.Response) -> str | None:
    """Why `response`'s body is not OpenAI's error object, or None:
    {"error": {"message": non-empty text, "type": text, "param": text or
    null, "code": text or null}}."""
    try:
        body: Any = json.loads(response.content)
    except ValueError:
        return f"not JSON: {response.content[:200]!r}"
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict):
        return f"no error object: {body!r:.300}"
    if set(error) != {"message", "type", "param", "code"}:
        return f"error's fields are {sorted(error)}"
    if not isinstance(error["message"], str) or not error["message"].strip():
        return f"error.message is {error['message']!r}"
    if not isinstance(error["type"], str):
        return f"error.type is {error['type']!r}"
    for field in ("param", "code"):
        if error[field] is not None and not isinstance(error[field], str):
            return f"error.{field} is {error[field]!r}"
    return None
