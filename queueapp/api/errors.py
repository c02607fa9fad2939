"""One place that turns errors into HTTP answers: `{"detail": message, ...}`."""

from __future__ import annotations

from typing import Any

from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from queueapp.errors import GpuschedError, QueueClosed, QueueLimitReached, WaitBoundUnmet
from queueapp.policy import PolicyInvariantError


def _flatten(errors: Any, prefix: str = "") -> list[str]:
    """{"body": {"model": ["required"]}} -> ["body.model: required"]."""
    if isinstance(errors, dict):
        lines = []
        for key, value in errors.items():
            name = key if key != "non_field_errors" else ""
            lines += _flatten(value, f"{prefix}.{name}" if prefix and name else prefix or name)
        return lines
    if isinstance(errors, list):
        return [line for item in errors for line in _flatten(item, prefix)]
    return [f"{prefix}: {errors}" if prefix else str(errors)]


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, GpuschedError):
        message = f"{exc.field}: {exc.message}" if exc.field else exc.message
        body = {"detail": message}
        if isinstance(exc, WaitBoundUnmet):
            body["code"] = exc.code
        response = Response(body, status=exc.http_status)
        if isinstance(exc, QueueLimitReached | WaitBoundUnmet):
            response["Retry-After"] = str(exc.retry_after)
        if isinstance(exc, QueueClosed):
            response["Retry-After"] = "60"
        return response
    if isinstance(exc, PolicyInvariantError):
        return Response({"detail": str(exc)}, status=status.HTTP_400_BAD_REQUEST)
    if isinstance(exc, exceptions.ValidationError):
        return Response(
            {"detail": "; ".join(_flatten(exc.detail)), "errors": exc.detail},
            status=status.HTTP_400_BAD_REQUEST,
        )
    return drf_exception_handler(exc, context)
