"""llama-swap's in-flight request records, as its ``inflight`` events carry them.

internal/server/inflight.go tracks every model-dispatched request (one whose model was
identified, known or not) from before its admission to the end of its answer, and
internal/swaputil/events.go gives the record's fields. The request headers are Go's
``http.Header`` flattened to the first value per key (internal/server/captures.go
``headerMap``): keys in Go's canonical form (``X-Gpusched-Job-Id``), ``Host`` and
``Transfer-Encoding`` absent (Go moves them out of the header map), and the values of
``Authorization``, ``Proxy-Authorization``, ``Cookie``, ``Set-Cookie`` and ``X-Api-Key``
replaced by ``[REDACTED]`` (``redactHeaders``, case-insensitive). The response headers are
kept the same way once the answer's status line is written.

Events: an ``upsert`` with the whole record when a request arrives, when its answer's
headers are written, and as its body goes out (at most one per 250 ms, llama-swap's
``inflightUpdateInterval``; the simulator sends no trailing update after a quiet spell), a
``remove`` with its id when it ends, and a ``snapshot`` of all of them, oldest first, on
connect. Go omits an empty ``requests`` list, so an empty snapshot is
``{"operation":"snapshot"}``. ``elapsed_ms`` is counted when the event is made.
"""

from __future__ import annotations

import datetime
import string
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

UPDATE_INTERVAL_S = 0.25  # llama-swap's inflightUpdateInterval
REDACTED = "[REDACTED]"
SENSITIVE_HEADERS = frozenset(
    ("authorization", "proxy-authorization", "cookie", "set-cookie", "x-api-key")
)
# Go's net/http takes these out of Request.Header (into Request.Host, TransferEncoding).
_NOT_IN_GO_HEADER = frozenset(("host", "transfer-encoding"))
_TOKEN_CHARS = frozenset(string.ascii_letters + string.digits + "!#$%&'*+-.^_`|~")


class Operation(StrEnum):
    SNAPSHOT = "snapshot"
    UPSERT = "upsert"
    REMOVE = "remove"


def go_header_key(key: str) -> str:
    """Go's ``textproto.CanonicalMIMEHeaderKey``: ``x-api-key`` -> ``X-Api-Key``; a key
    with a character outside the token set is left as it is."""
    if not key or any(char not in _TOKEN_CHARS for char in key):
        return key
    return "-".join(part[:1].upper() + part[1:].lower() for part in key.split("-"))


def header_map(headers: Iterable[tuple[str, str]], *, request: bool) -> dict[str, str]:
    """Headers as llama-swap keeps them for a record: canonical keys, the first value of
    each, sensitive ones redacted, sorted (Go writes a map's keys in order)."""
    flat: dict[str, str] = {}
    for key, value in headers:
        canonical = go_header_key(key)
        if request and canonical.lower() in _NOT_IN_GO_HEADER:
            continue
        flat.setdefault(canonical, value)
    for key in flat:
        if key.lower() in SENSITIVE_HEADERS:
            flat[key] = REDACTED
    return dict(sorted(flat.items()))


def client_ip(forwarded_for: str, real_ip: str, *, peer_host: str) -> str:
    """llama-swap's ``clientIP`` (internal/server/log.go): the first X-Forwarded-For
    address, else X-Real-IP, else the connection's."""
    if forwarded_for:
        return forwarded_for.split(",", 1)[0].strip()
    return real_ip.strip() if real_ip else peer_host


def go_timestamp(at: float) -> str:
    """A Unix time as Go's ``time.Time`` marshals to JSON (RFC 3339, local zone, trailing
    zeros of the fraction dropped)."""
    moment = datetime.datetime.fromtimestamp(at).astimezone()
    text = moment.isoformat(timespec="microseconds")
    stamp, offset = text[:26], text[26:]
    stamp = stamp.rstrip("0").rstrip(".")
    return stamp + ("Z" if offset == "+00:00" else offset)


@dataclass
class InflightRequest:
    """One tracked request; ``fields`` in llama-swap's order, without ``elapsed_ms``."""

    started_at: float
    fields: dict[str, Any]
    last_emitted: float = field(default=0.0)

    @classmethod
    def arriving(
        cls,
        *,
        request_id: str,
        started_at: float,
        model: str,
        method: str,
        path: str,
        headers: Iterable[tuple[str, str]],
        remote_ip: str,
    ) -> InflightRequest:
        fields = {
            "id": request_id,
            "timestamp": go_timestamp(started_at),
            "model": model,
            "req_path": path,
            "method": method,
            "req_headers": header_map(headers, request=True),
            "remote_ip": remote_ip,
            "resp_headers": {},
            "resp_bytes": 0,
        }
        return cls(started_at=started_at, fields=fields, last_emitted=started_at)

    def record(self, now: float) -> dict[str, Any]:
        elapsed_ms = max(0, int((now - self.started_at) * 1000))
        return {**self.fields, "elapsed_ms": elapsed_ms}


def upsert_event(request: InflightRequest, now: float) -> dict[str, Any]:
    return {"operation": Operation.UPSERT.value, "request": request.record(now)}


def remove_event(request_id: str) -> dict[str, Any]:
    return {"operation": Operation.REMOVE.value, "id": request_id}


def snapshot_event(requests: Iterable[InflightRequest], now: float) -> dict[str, Any]:
    ordered = sorted(requests, key=lambda r: (r.started_at, r.fields["id"]))
    records = [request.record(now) for request in ordered]
    # Go's omitempty drops an empty list.
    return {"operation": Operation.SNAPSHOT.value, **({"requests": records} if records else {})}
