"""llama-swap's `apiKeys` in the simulator, and a record of the credentials
each request carried.

As llama-swap (internal/server/auth.go, internal/swaputil/http.go
`ExtractAPIKey`, internal/server/server.go `routes`): with keys configured,
every route but `GET /health`, `GET /wol-health`, `GET /`, `GET
/favicon.ico` and `GET /upstream` (a redirect), and every CORS preflight
(`OPTIONS`, answered before the check), needs one of them. The key is read
from `Authorization: Basic` (the password), else `Authorization: Bearer`,
else `x-api-key`; the scheme's case does not matter. A request without a
valid key gets 401, `WWW-Authenticate: Basic realm="llama-swap"` and the
error envelope "unauthorized: invalid or missing API key", in the format its
`Accept` asks for. Without keys every request passes, as in llama-swap.

The simulator's own test routes (`/sim/...`) need no key. Every request to
the others is recorded (`ApiKeyGate.seen`, `GET /sim/credentials`): which
credential headers it carried, which one gave the key, and whether the key
matched; never a credential's value, so a test can say that the simulator
saw gpusched's key and nothing else without the record holding a secret.
"""

from __future__ import annotations

import base64
import binascii
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from queueapp.upstream.simulator.payloads import dumps

OPEN_GET_PATHS = frozenset({"/health", "/wol-health", "/", "/favicon.ico", "/upstream"})
SIM_PREFIX = "/sim/"
CREDENTIALS_PATH = "/sim/credentials"
# Headers that carry a credential; a proxy in front of llama-swap should pass none of a caller's.
CREDENTIAL_HEADERS = ("authorization", "x-api-key", "cookie", "proxy-authorization")
MSG_UNAUTHORIZED = "unauthorized: invalid or missing API key"
WWW_AUTHENTICATE = 'Basic realm="llama-swap"'
# The records kept: the oldest go first.
MAX_SEEN = 10_000


def keys_checked(keys: Iterable[str]) -> tuple[str, ...]:
    """The keys as llama-swap's config loader takes them (internal/config/load.go)."""
    checked = tuple(keys)
    for index, key in enumerate(checked):
        if not key:
            raise ValueError("empty api key found in apiKeys")
        if " " in key:
            raise ValueError(f"apiKeys[{index}]: api key cannot contain spaces")
    return checked


def presented_key(headers: Mapping[str, str]) -> tuple[str | None, str]:
    """Where the request's key came from ("basic", "bearer", "x-api-key" or
    None) and the key, in llama-swap's order: Basic, then Bearer, then x-api-key."""
    bearer = basic = ""
    scheme, _, credentials = (headers.get("Authorization") or "").partition(" ")
    if scheme.lower() == "bearer":
        bearer = credentials
    elif scheme.lower() == "basic":
        try:
            decoded = base64.b64decode(credentials, validate=True).decode("utf-8", "replace")
        except (binascii.Error, ValueError):
            decoded = ""
        _, colon, password = decoded.partition(":")
        basic = password if colon else ""
    if basic:
        return "basic", basic
    if bearer:
        return "bearer", bearer
    key = headers.get("x-api-key") or ""
    return ("x-api-key" if key else None), key


class _Handler(Protocol):
    command: str
    path: str
    headers: Any

    def _read_body(self) -> bytes: ...

    def _send(self, status: int, payload: bytes, ctype: str, **headers: str) -> None: ...

    def _send_error(
        self, status: int, message: str, code: str | None = None, **headers: str
    ) -> None: ...


class ApiKeyGate:
    """llama-swap's key check in front of every route, and the record of what came."""

    def __init__(self, keys: Iterable[str] = ()) -> None:
        self.keys = keys_checked(keys)
        self._seen: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def seen(self) -> list[dict[str, Any]]:
        """Per request, in arrival order: `received_at`, `method`, `path`, `credential_headers`
        (the names of those it carried), `key_from` (where the key was read,
        or None) and `key_matched` (None when the simulator has no keys)."""
        with self._lock:
            return [dict(entry) for entry in self._seen]

    def admits(self, handler: _Handler) -> bool:
        """Whether the request goes on to its route; if not, it was answered here."""
        path = handler.path.split("?", 1)[0]
        if path == CREDENTIALS_PATH and handler.command == "GET":
            handler._send(200, dumps(self.seen()), "application/json")
            return False
        if path.startswith(SIM_PREFIX):
            return True
        key_from, key = presented_key(handler.headers)
        matched = key in self.keys if self.keys else None
        with self._lock:
            self._seen.append(
                {
                    "received_at": time.time(),
                    "method": handler.command,
                    "path": path,
                    "credential_headers": sorted(
                        name for name in CREDENTIAL_HEADERS if name in handler.headers
                    ),
                    "key_from": key_from,
                    "key_matched": matched,
                }
            )
            del self._seen[:-MAX_SEEN]
        if matched is not False or handler.command == "OPTIONS":
            return True
        if handler.command in ("GET", "HEAD") and path in OPEN_GET_PATHS:
            return True
        handler._read_body()  # the connection stays usable for the next request
        handler._send_error(401, MSG_UNAUTHORIZED, WWW_Authenticate=WWW_AUTHENTICATE)
        return False
