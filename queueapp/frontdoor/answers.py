"""Answers of the front door in the shapes OpenAI clients read."""

from __future__ import annotations

import json
from typing import Any

from django.http import JsonResponse

Headers = list[tuple[bytes, bytes]]


def openai_error_body(message: str, error_type: str, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type, "param": None, "code": code}}


def openai_error(
    status: int, message: str, error_type: str, code: str | None = None, **headers: str
) -> JsonResponse:
    """The same error as a Django response (Django's error pages on these paths)."""
    response = JsonResponse(openai_error_body(message, error_type, code), status=status)
    for name, value in headers.items():
        response[name.replace("_", "-")] = value
    return response


class Answer:
    """A whole answer for a raw ASGI `send`."""

    def __init__(
        self, status: int, body: bytes, content_type: str, headers: Headers | None = None
    ) -> None:
        self.status = status
        self.body = body
        self.headers: Headers = [
            (b"content-type", content_type.encode("latin-1")),
            (b"content-length", str(len(body)).encode()),
            *(headers or []),
        ]

    @classmethod
    def error(
        cls, status: int, message: str, error_type: str, code: str | None = None, **headers: str
    ) -> Answer:
        extra = [
            (name.replace("_", "-").lower().encode(), v.encode()) for name, v in headers.items()
        ]
        body = json.dumps(openai_error_body(message, error_type, code)).encode()
        return cls(status, body, "application/json", extra)

    def with_headers(self, headers: Headers) -> Answer:
        self.headers.extend(headers)
        return self

    async def send(self, send: Any) -> None:
        await send({"type": "http.response.start", "status": self.status, "headers": self.headers})
        await send({"type": "http.response.body", "body": self.body})
