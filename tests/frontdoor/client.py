"""Django's test `Client`, for the front door's paths.

The front door is a plain ASGI app in front of Django (gpusched/asgi.py), so
Django's test client never reaches it. This one calls the whole ASGI
application through httpx, with the same keyword arguments as Django's
client, and runs the front door's database calls on the test's own thread,
so they see what the test wrote in its transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import pkgutil
from types import ModuleType
from typing import Any
from unittest import mock

import httpx
from asgiref.sync import async_to_sync, sync_to_async

from gpusched.asgi import application
from queueapp import frontdoor
from queueapp.frontdoor import exchange, gateway

BASE_URL = "http://testserver"


def front_door_modules() -> list[ModuleType]:
    """Every module of the front door: each binds `db` and `gateway` itself."""
    return [
        importlib.import_module(f"{frontdoor.__name__}.{module.name}")
        for module in pkgutil.iter_modules(frontdoor.__path__)
    ]


def on_test_thread(function, *, gpu_path: bool = False):  # type: ignore[no-untyped-def]
    """`gateway.db` on the test's thread, for both of its executors."""
    return sync_to_async(function, thread_sensitive=True)


class FrontDoorResponse:
    def __init__(self, response: httpx.Response) -> None:
        self.status_code = response.status_code
        self.content = response.content
        self.headers = response.headers
        self._response = response

    def __getitem__(self, name: str) -> str:
        return self.headers[name]

    def json(self) -> Any:
        return self._response.json()


class FrontDoorClient:
    def __init__(self, REMOTE_ADDR: str = "127.0.0.1", HTTP_HOST: str = "testserver") -> None:  # noqa: N803
        self.address = REMOTE_ADDR
        self.host = HTTP_HOST

    def get(self, path: str, **extra: str) -> FrontDoorResponse:
        return self._call("GET", path, b"", "", extra)

    def post(
        self, path: str, data: bytes | str = b"", content_type: str = "", **extra: str
    ) -> FrontDoorResponse:
        raw = data.encode() if isinstance(data, str) else data
        return self._call("POST", path, raw, content_type, extra)

    def _call(
        self, method: str, path: str, raw: bytes, content_type: str, extra: dict[str, str]
    ) -> FrontDoorResponse:
        headers = {"host": self.host}
        if content_type:
            headers["content-type"] = content_type
        for key, value in extra.items():  # Django's HTTP_X_Y=... spelling
            if key.startswith("HTTP_"):
                headers[key[5:].replace("_", "-").lower()] = value
        encoded = [(name.encode(), value.encode()) for name, value in headers.items()]
        return FrontDoorResponse(
            front_door_call(method, path, raw, encoded, client=(self.address, 40000))
        )


class CallHung(AssertionError):
    """The front door did not answer within the call's deadline."""


def front_door_call(
    method: str,
    target: str,
    body: bytes,
    headers: list[tuple[bytes, bytes]],
    *,
    client: tuple[str, int] = ("127.0.0.1", 40000),
    deadline: float | None = None,
) -> httpx.Response:
    """One call through the whole ASGI application, header values as raw
    bytes (HTTP carries latin-1; httpx would encode text as ASCII): the front
    door's database calls on the test's thread (they see its transaction)
    and a gateway of its own, stopped before the call returns, which waits
    until every job the call relayed is written as ended. Past `deadline`
    seconds the call is cancelled, as a caller hanging up would, and
    CallHung is raised: a job waiting for a grant that never comes fails
    the test instead of hanging it."""
    own_gateway = gateway.Gateway()

    async def send() -> httpx.Response:
        transport = httpx.ASGITransport(app=application, client=client)
        try:
            async with httpx.AsyncClient(transport=transport, base_url=BASE_URL) as c:
                request = c.build_request(method, target, content=body, headers=headers)
                try:
                    return await asyncio.wait_for(c.send(request), deadline)
                except TimeoutError:
                    raise CallHung(f"{method} {target}: no answer in {deadline} s") from None
        finally:
            await own_gateway.stop()
            # The front door keeps one llama-swap client per event loop; this
            # call's loop ends here, so its clients (and connections) go too.
            loop = asyncio.get_running_loop()
            for key in [key for key in exchange._upstreams if key[0] is loop]:
                await exchange._upstreams.pop(key).aclose()

    replacements = {"db": (gateway.db, on_test_thread), "gateway": (gateway.gateway, own_gateway)}
    with contextlib.ExitStack() as patches:
        for module in front_door_modules():
            for name, (original, replacement) in replacements.items():
                if getattr(module, name, None) is original:
                    patches.enter_context(mock.patch.object(module, name, replacement))
        return async_to_sync(send)()
