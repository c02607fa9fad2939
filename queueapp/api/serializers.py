"""Input validation and output rendering. No business logic here."""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.db import models
from django.urls import reverse
from drf_spectacular.extensions import OpenApiSerializerExtension
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from queueapp.job_body import MAX_MODEL_NAME, MODEL_NAME_PATTERN, body_problem, model_name_problem
from queueapp.models import Job, JobStatus, Member, Policy
from queueapp.services import POLICY_FIELDS
from queueapp.upstream.client import FORWARDED_PATHS
from queueapp.webhooks.ssrf import RefusedAddress, check_literal


# JSON types as the schema states them: DRF alone would take "5" for an
# integer, 5 for a string and "yes" for a boolean.
class JsonStringField(serializers.CharField):
    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            raise serializers.ValidationError(f"must be a string, not {_json_type(data)}")
        return super().to_internal_value(data)


class JsonIntegerField(serializers.IntegerField):
    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool) or not isinstance(data, int):
            raise serializers.ValidationError(f"must be an integer, not {_json_type(data)}")
        return super().to_internal_value(data)


class JsonFloatField(serializers.FloatField):
    def to_internal_value(self, data: Any) -> float:
        if isinstance(data, bool) or not isinstance(data, (int, float)):
            raise serializers.ValidationError(f"must be a number, not {_json_type(data)}")
        return super().to_internal_value(data)


class JsonBooleanField(serializers.BooleanField):
    def to_internal_value(self, data: Any) -> bool:
        if not isinstance(data, bool):
            raise serializers.ValidationError(f"must be true or false, not {_json_type(data)}")
        return data


def _json_type(value: Any) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}
    names |= {list: "an array", dict: "an object", type(None): "null"}
    return names.get(type(value), type(value).__name__)


@extend_schema_field({"type": "string", "minLength": 1, "maxLength": 200, "pattern": r"\S"})
class ChainIdField(JsonStringField):
    pass


class ChainInput(serializers.Serializer):
    id = ChainIdField(max_length=200)
    # Stored as PostgreSQL `integer`.
    index = JsonIntegerField(min_value=0, max_value=2**31 - 1)
    total = JsonIntegerField(min_value=1, max_value=2**31 - 1)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs["index"] >= attrs["total"]:
            raise serializers.ValidationError(
                {"index": f"must be below total ({attrs['total']}); units count from 0"}
            )
        return attrs


class RejectUnknownFields:
    """Refuses unknown fields, so a typo is a 400 that names it, not a silent no-op."""

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(self.initial_data) - set(self.fields))  # type: ignore[attr-defined]
        if unknown:
            raise serializers.ValidationError({name: "unknown field" for name in unknown})
        return super().validate(attrs)  # type: ignore[misc]


@extend_schema_field({"type": "string", "enum": list(FORWARDED_PATHS)})
class ForwardedPathField(serializers.CharField):
    pass


@extend_schema_field(
    {
        "type": "object",
        "properties": {
            # No control character; at least one that is not a space.
            "model": {
                "type": "string",
                "minLength": 1,
                "maxLength": MAX_MODEL_NAME,
                "pattern": MODEL_NAME_PATTERN,
            }
        },
        "required": ["model"],
        "additionalProperties": True,
    }
)
class LlamaSwapBodyField(serializers.JSONField):
    pass


@extend_schema_field(
    {"type": "string", "format": "uri", "maxLength": 2000, "pattern": "^(https?://.+)?$"}
)
class CallbackUrlField(serializers.URLField):
    pass


class RejectUnknownFieldsScheme(OpenApiSerializerExtension):
    """Says in the schema what RejectUnknownFields does: no other fields."""

    target_class = RejectUnknownFields
    match_subclasses = True

    def map_serializer(self, auto_schema, direction):  # type: ignore[no-untyped-def]
        schema = auto_schema._map_serializer(self.target, direction, bypass_extensions=True)
        return {**schema, "additionalProperties": False}


class JobSubmitInput(RejectUnknownFields, serializers.Serializer):
    path = ForwardedPathField(
        help_text="The llama-swap path the body is posted to, e.g. /v1/chat/completions."
    )
    body = LlamaSwapBodyField(
        help_text="The JSON request llama-swap gets, with its `model`; at most "
        "GPUSCHED_MAX_BODY_BYTES (1 MiB) as compact JSON."
    )
    callback_url = CallbackUrlField(
        required=False,
        allow_blank=True,
        max_length=2000,
        help_text="http(s) URL to notify; private, loopback and other internal addresses "
        "are refused.",
    )
    chain = ChainInput(required=False, allow_null=True)

    def validate_path(self, value: str) -> str:
        if value not in FORWARDED_PATHS:
            raise serializers.ValidationError(
                f"{value!r} is not a path gpusched forwards; "
                f"use one of {', '.join(FORWARDED_PATHS)}"
            )
        return value

    def validate_body(self, value: Any) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise serializers.ValidationError(
                f"must be a JSON object (the request llama-swap gets), not {type(value).__name__}"
            )
        problem = body_problem(value)
        if problem:
            raise serializers.ValidationError(problem)
        size = len(json.dumps(value, separators=(",", ":")).encode())
        limit = settings.GPUSCHED_MAX_BODY_BYTES
        if size > limit:
            raise serializers.ValidationError(f"is {size} bytes, more than the limit of {limit}")
        problem = model_name_problem(value.get("model"))
        if problem:
            raise serializers.ValidationError({"model": problem})
        return value

    def validate_callback_url(self, value: str) -> str:
        if value and not value.lower().startswith(("http://", "https://")):
            raise serializers.ValidationError("must be an http:// or https:// URL")
        try:
            check_literal(value)
        except RefusedAddress as exc:
            raise serializers.ValidationError(str(exc)) from exc
        return value


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


def _absolute(request: Any, path: str) -> str:
    return request.build_absolute_uri(path) if request is not None else path


def job_result(job: Job, request: Any) -> dict[str, Any] | None:
    if job.result_status_code is None:
        return None
    url = None
    if job.result_file:
        url = _absolute(request, reverse("api-job-result", args=[job.pk]))
    return {
        "status_code": job.result_status_code,
        "content_type": job.result_content_type,
        "body": job.result_body,
        "url": url,
    }


def job_output(
    job: Job, *, request: Any, score: dict[str, Any] | None, estimate: dict[str, Any] | None
) -> dict[str, Any]:
    """`GET /api/jobs/{id}/` as DESIGN.md names it."""
    return {
        "id": job.pk,
        "status": job.status,
        "model": job.model,
        "path": job.path,
        "member": job.member.name,
        "priority_requested": job.priority_requested,
        "priority": job.priority,
        "score": score,
        "estimate": estimate,
        "submitted_at": _iso(job.submitted_at),
        "started_at": _iso(job.started_at),
        "finished_at": _iso(job.finished_at),
        "attempts": job.attempts,
        "result": job_result(job, request),
        "error": job.error or None,
        "callback_url": job.callback_url or None,
        "chain": (
            {"id": job.chain_id, "index": job.chain_index, "total": job.chain_total}
            if job.chain_id
            else None
        ),
        "body": job.body,
        "webhook": job_webhook(job),
        "links": {
            "why": _absolute(request, reverse("api-job-why", args=[job.pk])),
            "why_page": _absolute(request, reverse("job-why-page", args=[job.pk])),
        },
    }


def job_webhook(job: Job) -> dict[str, Any] | None:
    """The callback and every delivery attempt (the delivery log)."""
    if not job.callback_url:
        return None
    return {
        "url": job.callback_url,
        "deliveries": [
            {
                "id": delivery.pk,
                "event": delivery.event_type,
                "webhook_id": delivery.webhook_id,
                "status": delivery.status,
                "attempts": [
                    {
                        "at": attempt.at.isoformat(),
                        "status_code": attempt.status_code,
                        "duration_ms": round(attempt.duration_ms or 0.0, 1),
                        "error": attempt.error or None,
                    }
                    for attempt in delivery.attempt_log.all()
                ],
                "next_attempt_at": delivery.next_attempt_at.isoformat()
                if delivery.status == "pending"
                else None,
                "delivered_at": _iso(delivery.delivered_at),
                "last_error": delivery.last_error or None,
            }
            for delivery in job.webhooks.order_by("id").prefetch_related("attempt_log")
        ],
    }


def job_score(job: Job, live_terms: dict[str, Any] | None) -> dict[str, Any] | None:
    """Live terms while queued; the terms it won with once dispatched."""
    if job.status == JobStatus.QUEUED and live_terms is not None:
        return {**live_terms, "as_of": "now"}
    if job.score_at_dispatch:
        return {**job.score_at_dispatch, "as_of": "dispatch"}
    return None


class MeOutput(serializers.ModelSerializer):
    tier = serializers.CharField(source="tier.name")

    class Meta:
        model = Member
        fields = ["name", "tier", "is_staff", "webhook_secret"]


class PolicySerializer(RejectUnknownFields, serializers.ModelSerializer):
    serializer_field_mapping = {
        **serializers.ModelSerializer.serializer_field_mapping,
        models.IntegerField: JsonIntegerField,
        models.PositiveIntegerField: JsonIntegerField,
        models.BooleanField: JsonBooleanField,
    }
    aging_divisor = JsonFloatField(
        min_value=1e-6, help_text="Seconds of waiting per point of aging; fractions allowed."
    )
    swap_affinity_bonus = JsonFloatField(min_value=0)
    lease_seconds = JsonFloatField(min_value=1, max_value=3600)

    class Meta:
        model = Policy
        fields = list(POLICY_FIELDS)
        extra_kwargs = {
            "band_spacing": {
                "min_value": 1,
                # The check itself is the policy's, so the refusal names the numbers.
                "help_text": "Points between bands that tier bonus plus swap affinity must stay "
                "below; at most 100, the spacing of the priority aliases.",
            },
            "max_attempts": {"min_value": 1},
        }


# --- Output shapes, for the OpenAPI schema ----------------------------------
# The views render plain dicts (job_output, the queue state, job_why, ...);
# these serializers only describe them. tests/security/test_schema_fuzz.py
# checks every answer against the schema, so a description that drifts from
# what is rendered fails a test.


class ErrorOutput(serializers.Serializer):
    detail = serializers.CharField(help_text="What went wrong; a field's name comes first.")
    errors = serializers.JSONField(
        required=False, help_text="Validation errors by field (400 on invalid input only)."
    )


class ScoreOutput(serializers.Serializer):
    band = serializers.IntegerField()
    tier_bonus = serializers.FloatField()
    swap_affinity = serializers.FloatField()
    aging = serializers.FloatField()
    effective = serializers.FloatField()
    waited_seconds = serializers.FloatField(required=False)
    aged_seconds = serializers.FloatField(required=False)
    as_of = serializers.ChoiceField(
        choices=["now", "dispatch"], required=False, help_text="Terms now, or as dispatched."
    )


class EstimateOutput(serializers.Serializer):
    position = serializers.IntegerField(allow_null=True)
    start_at = serializers.DateTimeField(allow_null=True)
    seconds_until_start = serializers.FloatField(allow_null=True)
    run_seconds = serializers.FloatField(required=False)
    dispatch_paused = serializers.BooleanField()
    note = serializers.CharField()


class ResultOutput(serializers.Serializer):
    status_code = serializers.IntegerField()
    content_type = serializers.CharField(allow_blank=True)
    body = serializers.JSONField(allow_null=True, help_text="JSON or text answer, if stored.")
    url = serializers.URLField(allow_null=True, help_text="The stored file, if any.")


class ChainRefOutput(serializers.Serializer):
    id = serializers.CharField()
    index = serializers.IntegerField(allow_null=True)
    total = serializers.IntegerField(allow_null=True)


class WebhookAttemptOutput(serializers.Serializer):
    at = serializers.DateTimeField()
    status_code = serializers.IntegerField(allow_null=True)
    duration_ms = serializers.FloatField()
    error = serializers.CharField(allow_null=True)


class WebhookDeliveryOutput(serializers.Serializer):
    id = serializers.IntegerField()
    event = serializers.CharField()
    webhook_id = serializers.CharField()
    status = serializers.CharField()
    attempts = WebhookAttemptOutput(many=True)
    next_attempt_at = serializers.DateTimeField(allow_null=True)
    delivered_at = serializers.DateTimeField(allow_null=True)
    last_error = serializers.CharField(allow_null=True)


class WebhookOutput(serializers.Serializer):
    url = serializers.CharField()
    deliveries = WebhookDeliveryOutput(many=True)


class JobLinksOutput(serializers.Serializer):
    why = serializers.URLField()
    why_page = serializers.URLField()


class JobOutput(serializers.Serializer):
    id = serializers.IntegerField()
    status = serializers.ChoiceField(choices=JobStatus.choices)
    model = serializers.CharField()
    path = serializers.CharField()
    member = serializers.CharField()
    priority_requested = serializers.IntegerField(help_text="As the header asked, before caps.")
    priority = serializers.IntegerField(help_text="Applied: the band.")
    score = ScoreOutput(allow_null=True)
    estimate = EstimateOutput(allow_null=True, help_text="While queued.")
    submitted_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)
    attempts = serializers.IntegerField()
    result = ResultOutput(allow_null=True)
    error = serializers.CharField(allow_null=True)
    callback_url = serializers.CharField(allow_null=True)
    chain = ChainRefOutput(allow_null=True)
    body = serializers.JSONField(help_text="The request llama-swap gets.")
    webhook = WebhookOutput(allow_null=True)
    links = JobLinksOutput()


class JobListOutput(serializers.Serializer):
    results = JobOutput(many=True)


class ChainEstimateOutput(serializers.Serializer):
    seconds_left = serializers.FloatField()
    seconds_per_unit = serializers.FloatField()
    basis = serializers.CharField()


class ChainOutput(serializers.Serializer):
    id = serializers.CharField()
    total = serializers.IntegerField(allow_null=True)
    done = serializers.IntegerField()
    submitted = serializers.IntegerField()
    queued = serializers.IntegerField()
    running = serializers.IntegerField()
    failed = serializers.IntegerField()
    cancelled = serializers.IntegerField()
    started_at = serializers.DateTimeField(allow_null=True)
    time_used_seconds = serializers.FloatField()
    estimate = ChainEstimateOutput()


class ChainListOutput(serializers.Serializer):
    results = ChainOutput(many=True)


class ChainCancelOutput(serializers.Serializer):
    id = serializers.CharField()
    cancelled = serializers.IntegerField(help_text="Queued units cancelled.")


class BandStatsOutput(serializers.Serializer):
    band = serializers.IntegerField()
    queued = serializers.IntegerField()
    longest_wait_seconds = serializers.FloatField()
    dispatched = serializers.IntegerField()
    order_changed_by = serializers.DictField(child=serializers.IntegerField())


class StatsOutput(serializers.Serializer):
    window = serializers.CharField()
    bands = BandStatsOutput(many=True)


class QueueEntryOutput(serializers.Serializer):
    """A running or queued job; another member's shows no name, path or chain."""

    id = serializers.IntegerField()
    position = serializers.IntegerField(allow_null=True)
    member = serializers.CharField(allow_null=True)
    mine = serializers.BooleanField()
    tier = serializers.CharField()
    model = serializers.CharField()
    path = serializers.CharField(allow_null=True)
    priority = serializers.IntegerField()
    chain = ChainRefOutput(allow_null=True)
    submitted_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField(allow_null=True)
    score = serializers.DictField(child=serializers.JSONField())
    why = serializers.CharField()
    estimated_start_at = serializers.DateTimeField(required=False)
    estimated_end_at = serializers.DateTimeField(required=False)


class QueueDecisionOutput(serializers.Serializer):
    at = serializers.DateTimeField()
    job = serializers.IntegerField()
    member = serializers.CharField(allow_null=True)
    mine = serializers.BooleanField()
    model = serializers.CharField()
    band = serializers.IntegerField()
    effective = serializers.FloatField(allow_null=True)
    swap_needed = serializers.BooleanField()
    changed_by = serializers.ListField(child=serializers.CharField())


class QueueChainOutput(ChainOutput):
    member = serializers.CharField(allow_null=True)
    mine = serializers.BooleanField()


class UpstreamOutput(serializers.Serializer):
    reachable = serializers.BooleanField(allow_null=True)
    checked_at = serializers.DateTimeField(allow_null=True)
    error = serializers.CharField(allow_null=True)


class QueueOutput(serializers.Serializer):
    as_of = serializers.DateTimeField()
    resident_model = serializers.CharField(allow_null=True, allow_blank=True)
    dispatch_paused = serializers.BooleanField()
    upstream = UpstreamOutput()
    running = QueueEntryOutput(allow_null=True)
    queued = QueueEntryOutput(many=True)
    queued_total = serializers.IntegerField()
    bands = BandStatsOutput(many=True)
    recent_decisions = QueueDecisionOutput(many=True)
    chains = QueueChainOutput(many=True)


class WhyOutput(serializers.Serializer):
    job = serializers.IntegerField()
    status = serializers.ChoiceField(choices=JobStatus.choices)
    model = serializers.CharField()
    band = serializers.IntegerField()
    submitted_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)
    still_waiting = serializers.BooleanField()
    measured_wait_seconds = serializers.FloatField()
    parts = serializers.ListField(
        child=serializers.DictField(child=serializers.JSONField()),
        help_text="The wait split into parts that add up to it.",
    )
    parts_total_seconds = serializers.FloatField()
    own_swap_seconds = serializers.FloatField(allow_null=True)
    summary = serializers.CharField()


class HealthUpstreamOutput(UpstreamOutput):
    url = serializers.CharField()
    resident_model = serializers.CharField(allow_null=True)


class HealthOutput(serializers.Serializer):
    status = serializers.ChoiceField(choices=["ok", "degraded", "down"])
    database = serializers.CharField()
    upstream = HealthUpstreamOutput(required=False)
    queue = serializers.DictField(child=serializers.IntegerField(), required=False)
