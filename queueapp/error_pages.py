"""Django's error answers (no route, bad request, forbidden, crash) in the
caller's language: JSON `{"detail"}` under /api/, OpenAI's error shape on the
front door's paths, Django's own pages elsewhere. None of them repeats what
the request carried."""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.core.exceptions import DisallowedHost, RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views import defaults

from queueapp.errors import (
    DATABASE_RETRY_AFTER_SECONDS,
    DATABASE_UNAVAILABLE,
    SERVER_BUSY,
    SERVER_BUSY_RETRY_AFTER_SECONDS,
    pool_exhausted,
)
from queueapp.frontdoor import FRONT_DOOR_PATHS, openai_error

OPENAI_PREFIXES = ("/v1/", "/sdapi/")


def _answer(
    request: HttpRequest,
    status: int,
    message: str,
    error_type: str,
    code: str,
    page: Callable[[], HttpResponse],
) -> HttpResponse:
    path = request.path
    if path.startswith("/api/"):
        return JsonResponse({"detail": message}, status=status)
    if path in FRONT_DOOR_PATHS or path.startswith(OPENAI_PREFIXES):
        return openai_error(status, message, error_type, code)
    return page()


def not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    return _answer(
        request,
        404,
        "no such path (job ids are integers; see /api/schema/ for the paths)",
        "invalid_request_error",
        "not_found",
        lambda: defaults.page_not_found(request, exception),
    )


def bad_request(request: HttpRequest, exception: Exception) -> HttpResponse:
    if isinstance(exception, RequestDataTooBig):
        message = f"the request body is larger than {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes"
    elif isinstance(exception, DisallowedHost):
        message = "the Host header names a host this server does not serve"
    else:
        message = "bad request: malformed or too large"
    return _answer(
        request,
        400,
        message,
        "invalid_request_error",
        "bad_request",
        lambda: defaults.bad_request(request, exception),
    )


def permission_denied(request: HttpRequest, exception: Exception) -> HttpResponse:
    return _answer(
        request,
        403,
        "forbidden",
        "invalid_request_error",
        "forbidden",
        lambda: defaults.permission_denied(request, exception),
    )


def server_error(request: HttpRequest) -> HttpResponse:
    return _answer(
        request,
        500,
        "internal error; it has been logged",
        "server_error",
        "internal_error",
        lambda: defaults.server_error(request),
    )


def database_unavailable(
    request: HttpRequest, exception: BaseException | None = None
) -> HttpResponse:
    """503 while PostgreSQL is away, or while every connection of the pool is
    in use (queueapp/middleware.py): the message says which."""
    busy = exception is not None and pool_exhausted(exception)
    message = SERVER_BUSY if busy else DATABASE_UNAVAILABLE
    response = _answer(
        request,
        503,
        message,
        "server_error",
        "server_busy" if busy else "database_unavailable",
        lambda: HttpResponse(message, status=503, content_type="text/plain; charset=utf-8"),
    )
    response["Retry-After"] = str(
        SERVER_BUSY_RETRY_AFTER_SECONDS if busy else DATABASE_RETRY_AFTER_SECONDS
    )
    return response
