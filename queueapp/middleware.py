"""While PostgreSQL is away (a restart, a failover), answer 503 with the
reason and a Retry-After instead of a bare 500; the next request after it
returns reconnects (CONN_HEALTH_CHECKS, or the pool's check)."""

from __future__ import annotations

import logging

from django.http import HttpRequest, HttpResponse
from django.utils.deprecation import MiddlewareMixin

from queueapp.error_pages import database_unavailable
from queueapp.errors import DATABASE_ERRORS

logger = logging.getLogger(__name__)


class DatabaseUnavailableMiddleware(MiddlewareMixin):
    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not isinstance(exception, DATABASE_ERRORS):
            return None
        logger.warning("%s %s: database unavailable: %s", request.method, request.path, exception)
        return database_unavailable(request, exception)
