"""Django's test `Client`, for the front door's paths.

The front door is a plain ASGI app in front of Django (gpusched/asgi.py), so
Django's test client never reaches it. This one calls the whole ASGI
application through httpx, with the same keyword arguments as Django's
client, and runs the front door's database calls on the test's own thread,
so they see what the test wrote in its transaction.
"""

from __future__ import annotations

from typing import Any
from unittest import mock

import httpx
from asgiref.sync import async_to_sync, sync_to_async

from gpusched.asgi import application
from queueapp.frontdoor import calls, gateway

BASE_URL = "http://testserver"


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

        # A gateway of its own per call, stopped before the call's event loop
        # ends: its listener's connection closes with it.
        own_gateway = gateway.Gateway()

        async def send() -> httpx.Response:
            transport = httpx.ASGITransport(app=application, client=(self.address, 40000))
            try:
                async with httpx.AsyncClient(
                    transport=transport, base_url="http://testserver"
                ) as c:
                    return await c.request(method, path, content=raw, headers=headers)
            finally:
                await own_gateway.stop()

        with (
            mock.patch.object(calls, "db", on_test_thread),
            mock.patch.object(gateway, "db", on_test_thread),
            mock.patch.object(calls, "gateway", own_gateway),
            mock.patch.object(gateway, "gateway", own_gateway),
        ):
            return FrontDoorResponse(async_to_sync(send)())
