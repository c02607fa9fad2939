"""While PostgreSQL is away (a restart, a failover), answer 503 with the
reason and a Retry-After instead of a bare 500; the next request after it
returns reconnects (CONN_HEALTH_CHECKS)."""

from __future__ import annotations

import logging

from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.deprecation import MiddlewareMixin

from queueapp.frontdoor import FRONT_DOOR_PATHS, openai_error

logger = logging.getLogger(__name__)

DATABASE_RETRY_AFTER_SECONDS = 5
MESSAGE = "the database is unavailable (restarting?); nothing was changed; try again shortly"


class DatabaseUnavailableMiddleware(MiddlewareMixin):
    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not isinstance(exception, (OperationalError, InterfaceError)):
            return None
        logger.warning("%s %s: database unavailable: %s", request.method, request.path, exception)
        retry_after = str(DATABASE_RETRY_AFTER_SECONDS)
        if request.path in FRONT_DOOR_PATHS or request.path == "/v1/models":
            return openai_error(
                503, MESSAGE, "server_error", "database_unavailable", Retry_After=retry_after
            )
        response = JsonResponse({"detail": MESSAGE}, status=503)
        response["Retry-After"] = retry_after
        return response
