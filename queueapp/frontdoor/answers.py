"""Answers of the front door in the shapes OpenAI clients read.

A streaming call may have sent its head (200, `text/event-stream`) while it
waited in the queue (queueapp/frontdoor/waiting.py). An answer that comes
after that cannot change the status any more, so `Reply` sends it in the
stream's own form: an error as one `data:` line carrying OpenAI's error
object, which OpenAI's SDKs raise on, and the stream ends. Every answer of a
call goes through its `Reply`, so whichever part of the front door produced
the answer, a waiting stream ends in that form. Every answer that belongs to
a job carries the job's headers (`job_headers`).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from django.http import JsonResponse

from queueapp.errors import WaitBoundUnmet
from queueapp.models import Job
from queueapp.rendering import why_page_path

Headers = list[tuple[bytes, bytes]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


def openai_error_body(
    message: str, error_type: str, code: str | None = None, param: str | None = None
) -> dict[str, Any]:
    """OpenAI's error object; `param` names the request's field at fault."""
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


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
        cls,
        status: int,
        message: str,
        error_type: str,
        code: str | None = None,
        *,
        param: str | None = None,
        **headers: str,
    ) -> Answer:
        extra = [
            (name.replace("_", "-").lower().encode(), v.encode()) for name, v in headers.items()
        ]
        body = json.dumps(openai_error_body(message, error_type, code, param)).encode()
        return cls(status, body, "application/json", extra)

    def with_headers(self, headers: Headers) -> Answer:
        self.headers.extend(headers)
        return self

    async def send(self, send: Any) -> None:
        await send({"type": "http.response.start", "status": self.status, "headers": self.headers})
        await send({"type": "http.response.body", "body": self.body})

    def as_event(self) -> bytes:
        """This answer as the last event of a stream whose head went out:
        an error (400 and above) as `data: {"error": {...}}` with OpenAI's
        error object (the upstream's own when its body carries one), any
        other answer's body as the event's data."""
        if self.status < 400:
            lines = self.body.decode("utf-8", "replace").splitlines() or [""]
            return "".join(f"data: {line}\n" for line in lines).encode() + b"\n"
        event = {"error": _error_object(self.status, self.body)}
        return b"data: " + json.dumps(event).encode() + b"\n\n"


def _error_object(status: int, body: bytes) -> dict[str, Any]:
    """OpenAI's error object for an error answer: the one its body carries
    (llama-swap's envelope, OpenAI's shape), or one made from its text."""
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = None
    error = parsed.get("error") if isinstance(parsed, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return error
    text = error if isinstance(error, str) else body.decode("utf-8", "replace").strip()
    return {
        "message": text or f"the call ended with status {status}",
        "type": "invalid_request_error" if status < 500 else "server_error",
        "param": None,
        "code": f"http_{status}",
    }


def gpu_busy(exc: WaitBoundUnmet) -> Answer:
    """A wait bound the forecast cannot meet, or a queued job's that passed."""
    return Answer.error(
        503, exc.message, "server_error", exc.code, Retry_After=str(exc.retry_after)
    )


def job_headers(job: Job, score: float | None) -> Headers:
    """Every answer that belongs to a job says which job, and how it was ranked."""
    return [
        (b"x-gpusched-job-id", str(job.pk).encode()),
        (b"x-gpusched-priority-requested", str(job.priority_requested).encode()),
        (b"x-gpusched-priority-applied", str(job.priority).encode()),
        (b"x-gpusched-score", f"{score:.6g}".encode() if score is not None else b""),
        (b"x-gpusched-why", why_page_path(job.pk).encode()),
    ]


class Reply:
    """The caller's side of one call: its ASGI `send`, and whether the
    response's head went out (then the status is fixed, see the module)."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self.head_sent = False

    async def start(self, status: int, headers: Headers) -> None:
        """Send the head, unless it went out already (a waiting stream's)."""
        if self.head_sent:
            return
        self.head_sent = True
        await self._send({"type": "http.response.start", "status": status, "headers": headers})

    async def body(self, chunk: bytes, *, more: bool = True) -> None:
        await self._send({"type": "http.response.body", "body": chunk, "more_body": more})

    async def answer(self, answer: Answer) -> None:
        """The call's answer: whole, or as a started stream's last event."""
        if not self.head_sent:
            self.head_sent = True
            await answer.send(self._send)
            return
        await self.body(answer.as_event(), more=False)
