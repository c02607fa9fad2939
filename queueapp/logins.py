"""Token logins at every door (REST API, OpenAI front door, page login,
WebSocket), with a limit on failed attempts per client address.

Each failed token counts against the address it came from. Past
`GPUSCHED_AUTH_FAILURES_PER_MINUTE` failures within a minute, every attempt
from that address, even one with a correct token, is refused until a minute
after the last counted failure: guessing a token costs a minute per batch.

The counters live in Django's cache: in-process memory by default (one
Daphne process sees every request), Redis when `REDIS_URL` is set, so that
several web processes share them (without Redis, each of several
processes counts on its own). A successful login costs one cache read and
the token lookup, never a write.

The address is the peer Daphne saw (REMOTE_ADDR), never X-Forwarded-For,
which a client could set; behind a reverse proxy every client shares the
proxy's address, so such a proxy should do its own limiting.
"""

from __future__ import annotations

import math
import time

from django.conf import settings
from django.core.cache import cache

from queueapp.errors import GpuschedError
from queueapp.models import Member
from queueapp.selectors import member_by_token

WINDOW_SECONDS = 60
# Tokens are `gps_` and 43 URL-safe characters; anything much longer or not
# ASCII is refused without hashing it or asking the database.
TOKEN_MAX_LENGTH = 200


class TooManyFailedLogins(GpuschedError):
    http_status = 429

    def __init__(self, *, retry_after: int) -> None:
        super().__init__(f"too many failed logins from this address; try again in {retry_after} s")
        self.retry_after = retry_after


def _keys(client: str) -> tuple[str, str]:
    return f"gpusched:login-failures:{client}", f"gpusched:login-blocked:{client}"


def login_retry_after(*, client: str) -> int:
    """Seconds until `client` may try a token again (0: now)."""
    blocked_until = cache.get(_keys(client)[1])
    if blocked_until is None:
        return 0
    return max(0, math.ceil(blocked_until - time.time()))


def login_failure_record(*, client: str) -> None:
    limit = settings.GPUSCHED_AUTH_FAILURES_PER_MINUTE
    if limit <= 0:
        return
    failures_key, blocked_key = _keys(client)
    cache.add(failures_key, 0, timeout=WINDOW_SECONDS)
    try:
        failures = cache.incr(failures_key)
    except ValueError:  # expired between add and incr: this failure opens a new window
        cache.add(failures_key, 1, timeout=WINDOW_SECONDS)
        failures = 1
    if failures >= limit:
        cache.set(blocked_key, time.time() + WINDOW_SECONDS, timeout=WINDOW_SECONDS)
        cache.delete(failures_key)


def member_login(*, token: str, client: str) -> Member | None:
    """The member `token` belongs to, or None (a failure counted against `client`).

    Raises TooManyFailedLogins while `client` is over its limit, whatever the token.
    """
    wait = login_retry_after(client=client)
    if wait:
        raise TooManyFailedLogins(retry_after=wait)
    token = token.strip()
    member = None
    if token and len(token) <= TOKEN_MAX_LENGTH and token.isascii():
        member = member_by_token(token)
    if member is None:
        login_failure_record(client=client)
    return member


def client_address(meta: dict) -> str:
    """The address failures count against: the peer the server saw.

    A reverse proxy in front would make every client one address; this
    deployment serves directly (Daphne on the machine with the GPU)."""
    return str(meta.get("REMOTE_ADDR") or "unknown")
