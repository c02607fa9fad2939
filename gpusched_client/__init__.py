"""A small client for gpusched's REST API, and the `gpusched` command line."""

from gpusched_client.client import (
    BadRequest,
    Client,
    Conflict,
    Forbidden,
    GpuschedError,
    NotFound,
    RateLimited,
    Unauthorized,
    Unavailable,
    WaitTimeout,
)

__all__ = [
    "BadRequest",
    "Client",
    "Conflict",
    "Forbidden",
    "GpuschedError",
    "NotFound",
    "RateLimited",
    "Unauthorized",
    "Unavailable",
    "WaitTimeout",
]
