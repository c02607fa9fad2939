"""Input validation and output rendering. No business logic here."""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.urls import reverse
from rest_framework import serializers

from queueapp.models import Job, JobStatus, Member, Policy
from queueapp.services import POLICY_FIELDS
from queueapp.upstream.client import FORWARDED_PATHS
from queueapp.webhooks.ssrf import RefusedAddress, check_literal


class ChainInput(serializers.Serializer):
    id = serializers.CharField(max_length=200)
    index = serializers.IntegerField(min_value=0)
    total = serializers.IntegerField(min_value=1)

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


class JobSubmitInput(RejectUnknownFields, serializers.Serializer):
    path = serializers.CharField(
        help_text="The llama-swap path the body is posted to, e.g. /v1/chat/completions."
    )
    body = serializers.JSONField(help_text="The JSON request llama-swap gets, with its `model`.")
    callback_url = serializers.URLField(
        required=False, allow_blank=True, max_length=2000, help_text="http(s) URL to notify."
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
        size = len(json.dumps(value, separators=(",", ":")).encode())
        limit = settings.GPUSCHED_MAX_BODY_BYTES
        if size > limit:
            raise serializers.ValidationError(f"is {size} bytes, more than the limit of {limit}")
        model = value.get("model")
        if not isinstance(model, str) or not model.strip():
            raise serializers.ValidationError(
                {"model": "required: the name of the model llama-swap should run"}
            )
        if len(model) > 200:
            raise serializers.ValidationError({"model": "longer than 200 characters"})
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
    aging_divisor = serializers.FloatField(
        min_value=1e-6, help_text="Seconds of waiting per point of aging; fractions allowed."
    )
    swap_affinity_bonus = serializers.FloatField(min_value=0)
    lease_seconds = serializers.FloatField(min_value=1, max_value=3600)

    class Meta:
        model = Policy
        fields = list(POLICY_FIELDS)
        extra_kwargs = {"band_spacing": {"min_value": 1}, "max_attempts": {"min_value": 1}}
