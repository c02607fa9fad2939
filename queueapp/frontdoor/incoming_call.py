"""A front-door call as the ASGI server hands it over: method, path, query,
headers, the caller's address and, once read, the body's bytes. Every part
of the front door reads the call through this one record; the body's bytes
are the one copy a waiting call keeps (queueapp/frontdoor/calls.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Call:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    client: str
    body: bytes = b""

    @classmethod
    def from_scope(cls, scope: dict[str, Any]) -> Call:
        headers: dict[str, str] = {}
        for name, value in scope.get("headers", []):
            key = name.decode("latin-1").lower()
            text = value.decode("latin-1")
            headers[key] = f"{headers[key]},{text}" if key in headers else text
        client = scope.get("client") or ("unknown", 0)
        return cls(
            method=scope["method"],
            path=scope["path"],
            query=scope.get("query_string", b"").decode("latin-1"),
            headers=headers,
            client=str(client[0]),
        )
