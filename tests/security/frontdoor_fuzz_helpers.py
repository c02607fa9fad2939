"""An in-process caller of the front door for the fuzz: raw header bytes, any
method, and a deadline.

tests/frontdoor/client.py's `FrontDoorClient` takes header values as text,
which httpx encodes as ASCII; HTTP carries latin-1 bytes, so a fuzzer needs
bytes. It has no deadline either: a call whose job waited for a grant that
never comes would hang the run instead of failing it.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any
from unittest import mock

import httpx
from asgiref.sync import async_to_sync

from gpusched.asgi import application
from queueapp.frontdoor import calls, gateway
from tests.frontdoor.client import on_test_thread

# A call with a zero-second model ends in well under a second; past this it
# counts as hung (and is cancelled, as a caller hanging up would).
CALL_DEADLINE_SECONDS = 15.0


class CallHung(AssertionError):
    """The front door did not answer within CALL_DEADLINE_SECONDS."""


def front_door_call(
    method: str, target: str, body: bytes, headers: list[tuple[bytes, bytes]]
) -> httpx.Response:
    """One call through the whole ASGI application, as FrontDoorClient makes
    it: the front door's database calls on the test's thread (they see its
    transaction) and a gateway of its own, stopped before the call returns,
    which waits until every job the call relayed is written as ended."""
    own_gateway = gateway.Gateway()

    async def send() -> httpx.Response:
        transport = httpx.ASGITransport(app=application, client=("127.0.0.1", 40000))
        try:
            async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
                request = c.build_request(method, target, content=body, headers=headers)
                try:
                    return await asyncio.wait_for(c.send(request), CALL_DEADLINE_SECONDS)
                except TimeoutError:
                    raise CallHung(
                        f"{method} {target}: no answer in {CALL_DEADLINE_SECONDS} s"
                    ) from None
        finally:
            await own_gateway.stop()
            # The front door keeps one llama-swap client per event loop; this
            # call's loop ends here, so its clients (and connections) go too.
            loop = asyncio.get_running_loop()
            for key in [key for key in calls._upstreams if key[0] is loop]:
                await calls._upstreams.pop(key).aclose()

    with (
        mock.patch.object(calls, "db", on_test_thread),
        mock.patch.object(gateway, "db", on_test_thread),
        mock.patch.object(calls, "gateway", own_gateway),
        mock.patch.object(gateway, "gateway", own_gateway),
    ):
        return async_to_sync(send)()


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
