"""HTTP header values every client of another server reads the same way.

Pure functions, no Django: the upstream client, the front door and the
webhook delivery all parse a Retry-After with `retry_after_seconds`.
"""

from __future__ import annotations

import email.utils
import math
from datetime import UTC, datetime


def http_date(value: str | None) -> datetime | None:
    """An HTTP-date (RFC 9110 §5.6.7) as an aware datetime; None if it is not one."""
    try:
        when = email.utils.parsedate_to_datetime(value or "")
    except (TypeError, ValueError):
        return None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def retry_after_seconds(value: str | None, *, now: datetime | None = None) -> float | None:
    """Retry-After in seconds: delay-seconds or an HTTP-date (RFC 9110 §10.2.3).

    An HTTP-date counts from `now`: the answering server's clock when its
    answer has a Date header, since the date is on that clock; ours otherwise.
    None when absent or not a valid value (negative, not finite, unparsable).
    """
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        when = http_date(value)
        if when is None:
            return None
        return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())
    return seconds if math.isfinite(seconds) and seconds >= 0 else None
