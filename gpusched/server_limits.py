"""Daphne's HTTP parser (Twisted) refuses a request line or header line over
16 KiB by closing the connection without a word; the client sees a reset, not
an answer. This answers 431 with a sentence instead, through the hook Twisted
provides for it (`LineReceiver.lineLengthExceeded`). Other malformed requests
(headers over 16 KiB in total, more than 500 headers, NUL in a header, a bad
Content-Length) already get Twisted's 400.

A body over its path's limit is refused here too, as soon as it is known
to be: at its headers when its Content-Length says so, else (chunked) when
the bytes received pass the limit. Twisted would otherwise store the whole
body, and Daphne hand all of it to the application at once, before the
application's own limit (queueapp/job_body.py) could refuse it: a client
could fill the web server's memory with one request. The wiring
(gpusched/asgi.py) says what each path takes and how its refusal reads.

Why Daphne rather than uvicorn: on this app the two measured alike (the
app, not the server, sets the figures; docs/architecture.md, "Why Daphne"),
and uvicorn's default parser accepts headers of any size, which these
limits refuse. The listen backlog is raised for bursts of callers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from twisted.internet import reactor
from twisted.web.http import HTTPChannel, Request


def http_answer(status: int, reason: str, body: bytes, content_type: str) -> bytes:
    """A whole HTTP/1.1 answer that closes its connection."""
    return (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body


MESSAGE = b"A request line or header is longer than 16384 bytes.\n"
ANSWER = http_answer(431, "Request Header Fields Too Large", MESSAGE, "text/plain; charset=utf-8")


def _answer_431(channel: HTTPChannel, line: bytes) -> None:
    assert channel.transport is not None  # a line arrived, so the connection is open
    channel.transport.write(ANSWER)  # type: ignore[call-arg,misc]  # Twisted's interface declares no self
    channel.loseConnection()


# The whole HTTP answer refusing a body of `size` bytes on `path`, or None
# when the path takes that many.
BodyRefusal = Callable[[str, int], bytes | None]

# After a refusal, the rest of the body is read and dropped for this long
# (closing on unread bytes would reset the connection, and the client could
# lose the answer), then the connection is cut.
LINGER_SECONDS = 5.0


class _Dropped:
    """The channel's body decoder once the body is refused: reads, keeps nothing."""

    def dataReceived(self, data: bytes) -> None:  # noqa: N802  # Twisted's name
        pass

    def noMoreData(self) -> None:  # noqa: N802  # Twisted's name
        pass


def _path_of(channel: HTTPChannel) -> str:
    return urlsplit(getattr(channel, "_path", b"").decode("latin-1")).path


def _refuse(channel: HTTPChannel, answer: bytes) -> None:
    """Answer now; whatever else comes on this connection is dropped."""
    transport: Any = channel.transport
    channel._gpusched_refused = True  # type: ignore[attr-defined]  # read by content_received
    channel._transferDecoder = _Dropped()  # Twisted's own decoder slot
    transport.write(answer)
    transport.loseWriteConnection()
    clock: Any = reactor  # the module stands for the running reactor
    clock.callLater(LINGER_SECONDS, transport.abortConnection)


def _refusing_bodies(refusal: BodyRefusal) -> dict[str, Callable[..., None]]:
    """Twisted's hooks, wrapped: the headers' Content-Length, each chunk of a
    body whose length was not declared, and the body's end (a refused
    request never reaches the application, even when its last chunk came
    in the same read as the one that passed the limit)."""
    all_headers_received = HTTPChannel.allHeadersReceived
    all_content_received = HTTPChannel.allContentReceived
    handle_content_chunk = Request.handleContentChunk

    def headers_received(channel: HTTPChannel) -> None:
        length = getattr(channel, "length", None)
        answer = refusal(_path_of(channel), length) if length else None
        if answer is not None:
            _refuse(channel, answer)
            return
        all_headers_received(channel)

    def content_chunk(request: Request, data: bytes) -> None:
        channel = request.channel
        received = getattr(request, "_gpusched_received", 0) + len(data)
        request._gpusched_received = received  # type: ignore[attr-defined]  # counted here only
        if channel is not None and getattr(channel, "length", None) is None:
            answer = refusal(_path_of(channel), received)
            if answer is not None:
                _refuse(channel, answer)
                return
        handle_content_chunk(request, data)

    def content_received(channel: HTTPChannel) -> None:
        if getattr(channel, "_gpusched_refused", False):
            channel._transferDecoder = _Dropped()  # still dropping
            return
        all_content_received(channel)

    return {
        "allHeadersReceived": headers_received,
        "allContentReceived": content_received,
        "handleContentChunk": content_chunk,
    }


def install(body_refusal: BodyRefusal | None = None) -> None:
    # Twisted's own hook for an over-long line; Daphne gives no other way in.
    HTTPChannel.lineLengthExceeded = _answer_431  # type: ignore[method-assign,assignment]  # patching Twisted's class
    if body_refusal is not None and not getattr(HTTPChannel, "_gpusched_bodies", False):
        hooks = _refusing_bodies(body_refusal)
        # Patching Twisted's classes, as for the line above.
        HTTPChannel.allHeadersReceived = hooks["allHeadersReceived"]  # type: ignore[method-assign]
        HTTPChannel.allContentReceived = hooks["allContentReceived"]  # type: ignore[method-assign]
        Request.handleContentChunk = hooks["handleContentChunk"]  # type: ignore[method-assign]
        HTTPChannel._gpusched_bodies = True  # type: ignore[attr-defined]  # installed once per process


# Twisted's default accept queue is 50 connections: a burst of a thousand
# callers connecting at once would wait for SYN retries of a second or more.
LISTEN_BACKLOG = 4096


def daphne_command(python: str, *, port: int, access_log: bool = False) -> list[str]:
    """How gpusched is served (make run, the tests, the benchmarks and the
    service units alike): Daphne with a stop that lets requests finish
    (gpusched/serve.py)."""
    return [
        python,
        "-m",
        "gpusched.serve",
        "-e",
        f"tcp:port={port}:interface=127.0.0.1:backlog={LISTEN_BACKLOG}",
        "--verbosity",
        "1" if access_log else "0",
        "gpusched.asgi:application",
    ]
