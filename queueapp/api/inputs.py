"""Input validation: JSON types as the schema states them, and unknown fields refused.

No business logic: a service acts on what these validate. `PolicySerializer`
also renders the policy, the one output that is the model's fields as they are.
"""

from __future__ import annotations

import json
from typing import Any

from django.db import models
from drf_spectacular.extensions import OpenApiSerializerExtension
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from queueapp.errors import RequestTooLarge
from queueapp.job_body import (
    MAX_CALLBACK_URL,
    MAX_CHAIN_ID,
    MAX_GPU_NAME,
    MAX_MODEL_NAME,
    MODEL_NAME_PATTERN,
    body_problem,
    model_name_problem,
    rest_body_limit,
)
from queueapp.models import OnCallerGone, Policy
from queueapp.models.model_settings import MAX_TYPICAL_SECONDS
from queueapp.policy import MAX_PARALLEL
from queueapp.policy.priority import PathBandsInvalid, path_bands
from queueapp.policy.wait_bound import WaitBoundInvalid, band_defaults
from queueapp.upstream.client import FORWARDED_PATHS, FRONT_DOOR_PATHS
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


@extend_schema_field(
    {"type": "string", "minLength": 1, "maxLength": MAX_CHAIN_ID, "pattern": r"\S"}
)
class ChainIdField(JsonStringField):
    pass


class ChainInput(serializers.Serializer):
    id = ChainIdField(max_length=MAX_CHAIN_ID)
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
        unknown = sorted(set(self.initial_data) - set(self.fields))  # type: ignore[attr-defined]  # a mixin: the serializer has both
        if unknown:
            raise serializers.ValidationError({name: "unknown field" for name in unknown})
        return super().validate(attrs)  # type: ignore[misc]  # the serializer's validate, next in the MRO


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
    {
        "type": "string",
        "format": "uri",
        "maxLength": MAX_CALLBACK_URL,
        "pattern": "^(https?://.+)?$",
    }
)
class CallbackUrlField(serializers.URLField):
    pass


class RejectUnknownFieldsScheme(OpenApiSerializerExtension):
    """Says in the schema what RejectUnknownFields does: no other fields."""

    target_class = RejectUnknownFields
    match_subclasses = True

    def map_serializer(self, auto_schema, direction):
        schema = auto_schema._map_serializer(self.target, direction, bypass_extensions=True)
        return {**schema, "additionalProperties": False}


@extend_schema_field(
    {
        "nullable": True,
        "example": "interactive",
        "description": "The band asked for when the X-LlamaSwap-Priority header is absent (the "
        "header wins): a signed integer, or interactive (100), normal (0), batch (-100), "
        "background (-100), as a JSON number or string; anything else means 0. Clamped to the "
        "tier's floor and cap. Absent or null: the policy's band for the path "
        "(priority_by_path). Not forwarded; `body` is forwarded as given.",
    }
)
class PriorityField(serializers.JSONField):
    """Any JSON value: by the header's rules, garbage means 0 rather than a 400."""


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
        max_length=MAX_CALLBACK_URL,
        help_text="http(s) URL to notify; private, loopback and other internal addresses "
        "are refused.",
    )
    chain = ChainInput(required=False, allow_null=True)
    priority = PriorityField(required=False, allow_null=True)

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
        limit = rest_body_limit()
        if size > limit.bytes:
            raise RequestTooLarge(limit.refusal(size, "a job's body"), field="body")
        problem = model_name_problem(value.get("model"))
        if problem:
            raise serializers.ValidationError({"model": problem})
        return value

    def validate_callback_url(self, value: str) -> str:
        return callback_url_checked(value)


def callback_url_checked(value: str) -> str:
    """A callback URL the webhooks may call: http(s), not an internal address."""
    if value and not value.lower().startswith(("http://", "https://")):
        raise serializers.ValidationError("must be an http:// or https:// URL")
    try:
        check_literal(value)
    except RefusedAddress as exc:
        raise serializers.ValidationError(str(exc)) from exc
    return value


@extend_schema_field(
    {"type": "string", "minLength": 1, "maxLength": MAX_MODEL_NAME, "pattern": MODEL_NAME_PATTERN}
)
class ModelNameField(JsonStringField):
    """A model's name as llama-swap gets it, as `body.model` of a job is checked."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(trim_whitespace=False, **kwargs)


class PreloadInput(RejectUnknownFields, serializers.Serializer):
    model = ModelNameField(help_text="The model llama-swap should load.")
    gpu = JsonStringField(
        required=False,
        max_length=MAX_GPU_NAME,
        help_text="The GPU to load it on (a name from GET /api/gpus/); only that GPU "
        "runs the job. Absent: whichever GPU serving the model claims it.",
    )
    priority = PriorityField(
        required=False,
        allow_null=True,
        help_text="A number or an alias; the X-LlamaSwap-Priority header wins. Neither: "
        "-100 (background).",
    )
    callback_url = CallbackUrlField(
        required=False,
        allow_blank=True,
        max_length=MAX_CALLBACK_URL,
        help_text="http(s) URL to notify when the model is loaded (or the load failed).",
    )

    def validate_model(self, value: str) -> str:
        problem = model_name_problem(value)
        if problem:
            raise serializers.ValidationError(problem)
        return value

    def validate_callback_url(self, value: str) -> str:
        return callback_url_checked(value)


class PolicySerializer(RejectUnknownFields, serializers.ModelSerializer):
    serializer_field_mapping = {
        **serializers.ModelSerializer.serializer_field_mapping,
        models.IntegerField: JsonIntegerField,
        models.PositiveIntegerField: JsonIntegerField,
        models.BooleanField: JsonBooleanField,
        models.FloatField: JsonFloatField,
    }
    aging_divisor = JsonFloatField(
        min_value=1e-6, help_text="Seconds of waiting per point of aging; fractions allowed."
    )
    swap_affinity_bonus = JsonFloatField(min_value=0)
    lease_seconds = JsonFloatField(min_value=1, max_value=3600)
    max_wait_by_band = serializers.JSONField(
        help_text='Default wait bound per band in seconds, e.g. {"100": 30, "batch": 3600} '
        "(an alias is stored as its band); {}: none."
    )

    priority_by_path = serializers.JSONField(
        help_text="The band of a call that names none (no header, no `priority`), by path, "
        'e.g. {"/v1/audio/speech": "interactive", "/v1/images/generations": "batch"} (an '
        "alias is stored as its band); a path not listed: normal (0). Default: speech and "
        "transcriptions interactive."
    )

    def validate_max_wait_by_band(self, value: Any) -> dict[str, float]:
        try:
            return band_defaults(value)
        except WaitBoundInvalid as exc:
            raise serializers.ValidationError(str(exc)) from exc

    def validate_priority_by_path(self, value: Any) -> dict[str, int]:
        try:
            return path_bands(value, known_paths=FRONT_DOOR_PATHS)
        except PathBandsInvalid as exc:
            raise serializers.ValidationError(str(exc)) from exc

    class Meta:
        model = Policy
        fields = list(Policy.EDITABLE_FIELDS)
        extra_kwargs = {
            "band_spacing": {
                "min_value": 1,
                # The check itself is the policy's, so the refusal names the numbers.
                "help_text": "Points between bands that tier bonus plus swap affinity must stay "
                "below; at most 100, the spacing of the priority aliases.",
            },
            "max_attempts": {"min_value": 1},
        }


class ModelSettingInput(RejectUnknownFields, serializers.Serializer):
    parallel = serializers.IntegerField(
        required=False,
        allow_null=True,
        min_value=1,
        max_value=MAX_PARALLEL,
        help_text="Jobs of this model one GPU runs at once while it is loaded, whatever its "
        "servers say; set it to what the server answers at once. 1: one at a time. null: as "
        "its servers say (their slots, else their config's flag, else 1).",
    )
    on_caller_gone = serializers.ChoiceField(
        required=False,
        allow_null=True,
        choices=OnCallerGone.choices,
        error_messages={
            "invalid_choice": f"must be one of {', '.join(OnCallerGone.values)} "
            '(or null: by path), not "{input}"'
        },
        help_text="When a front-door caller hangs up while its request runs: close (close "
        "the request; llama-server stops) or drain (read llama-swap's answer to its end and "
        "discard it, the GPU held until then). null: drain for images, audio and /sdapi/, "
        "close for the other paths.",
    )

    typical_seconds = JsonFloatField(
        required=False,
        allow_null=True,
        min_value=0.01,
        max_value=MAX_TYPICAL_SECONDS,
        help_text="What a run of this model typically takes, in seconds: its jobs' estimate "
        "until its runs are learned. null: unknown until then.",
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        attrs = super().validate(attrs)
        if not attrs:
            raise serializers.ValidationError(
                "parallel, on_caller_gone or typical_seconds: give at least one"
            )
        return attrs


class GpuSettingInput(RejectUnknownFields, serializers.Serializer):
    enabled = JsonBooleanField(
        required=False, help_text="false: it finishes its jobs and claims no other."
    )
    one_model_at_a_time = JsonBooleanField(
        required=False,
        help_text="true: it runs one model's jobs at a time, whatever llama-swap's routing "
        "keeps loaded together.",
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        attrs = super().validate(attrs)
        if not attrs:
            raise serializers.ValidationError("enabled or one_model_at_a_time: give one or both")
        return attrs
