"""`GET /api/version/`: which release answers, and the schema it runs on.

Public, like the health check: a deployment script or an operator checks
what an upgrade left running without a token."""

from __future__ import annotations

from typing import Any

from django.db.migrations.recorder import MigrationRecorder
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response

from gpusched.version import version
from queueapp.api.views import ApiView


class VersionOutput(serializers.Serializer):
    version = serializers.CharField(help_text="gpusched's release (pyproject.toml).")
    migration = serializers.CharField(
        allow_null=True,
        help_text="The last of gpusched's migrations applied to the database; null when none.",
    )


class VersionView(ApiView):
    permission_classes = [AllowAny]
    authentication_classes: list[Any] = []

    @extend_schema(responses={200: VersionOutput}, summary="The release and its schema")
    def get(self, request: Request) -> Response:
        applied = (
            MigrationRecorder.Migration.objects.filter(app="queueapp")
            .order_by("-name")
            .values_list("name", flat=True)
            .first()
        )
        return Response({"version": version(), "migration": applied})
