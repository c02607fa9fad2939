"""Daphne's HTTP parser (Twisted) refuses a request line or header line over
16 KiB by closing the connection without a word; the client sees a reset, not
an answer. This answers 431 with a sentence instead, through the hook Twisted
provides for it (`LineReceiver.lineLengthExceeded`). Other malformed requests
(headers over 16 KiB in total, more than 500 headers, NUL in a header, a bad
Content-Length) already get Twisted's 400.

Why Daphne rather than uvicorn: on this app the two measured alike (the
app, not the server, sets the figures; docs/architecture.md, "Why Daphne"),
and uvicorn's default parser accepts headers of any size, which these
limits refuse. The listen backlog is raised for bursts of callers.
"""

from __future__ import annotations

from twisted.web.http import HTTPChannel

MESSAGE = b"A request line or header is longer than 16384 bytes.\n"
ANSWER = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
    b"Content-Type: text/plain; charset=utf-8\r\n"
    b"Content-Length: " + str(len(MESSAGE)).encode() + b"\r\n"
    b"Connection: close\r\n\r\n" + MESSAGE
)


def _answer_431(channel: HTTPChannel, line: bytes) -> None:
    assert channel.transport is not None  # a line arrived, so the connection is open
    channel.transport.write(ANSWER)  # type: ignore[call-arg,misc]  # Twisted's interface declares no self
    channel.loseConnection()


def install() -> None:
    # Twisted's own hook for an over-long line; Daphne gives no other way in.
    HTTPChannel.lineLengthExceeded = _answer_431  # type: ignore[method-assign,assignment]  # patching Twisted's class


# Twisted's default accept queue is 50 connections: a burst of a thousand
# callers connecting at once would wait for SYN retries of a second or more.
LISTEN_BACKLOG = 4096


def daphne_command(python: str, *, port: int, access_log: bool = False) -> list[str]:
    """How gpusched is served (make run, the tests and the benchmarks alike)."""
    return [
        python,
        "-m",
        "daphne",
        "-e",
        f"tcp:port={port}:interface=127.0.0.1:backlog={LISTEN_BACKLOG}",
        "--verbosity",
        "1" if access_log else "0",
        "gpusched.asgi:application",
    ]
