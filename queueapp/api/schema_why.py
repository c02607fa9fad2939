"""The output shape of `GET /api/jobs/{id}/why/`, for the OpenAPI schema
(the answer is rendered by queueapp/why/; queueapp/api/schema.py holds the
other shapes and says how they are checked)."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiParameter
from rest_framework import serializers

from queueapp.api.schema import ExpectedSecondsOutput, SwapOutput
from queueapp.models import JobStatus

as_of_parameter = OpenApiParameter(
    "as_of",
    {"type": "string", "format": "date-time"},
    description="Tell the answer as of this instant (ISO 8601 with its offset) instead of "
    "now, so that answers asked at one instant agree. Only for a job still queued, between "
    "its submission and now; otherwise a 400 that names `as_of`.",
)


class WhyOtherGpuOutput(serializers.Serializer):
    gpu = serializers.CharField()
    state = serializers.ChoiceField(choices=["does_not_serve", "disabled", "down", "busy"])
    reason = serializers.CharField()
    jobs = serializers.IntegerField(required=False, help_text="Other jobs it ran meanwhile.")
    busy_seconds = serializers.FloatField(required=False)


class WhyForeignLoadOutput(serializers.Serializer):
    gpu = serializers.CharField()
    requests = serializers.IntegerField()
    text = serializers.CharField()


class WhyCutOutput(serializers.Serializer):
    at = serializers.DateTimeField()
    text = serializers.CharField()


class WhyPieceOutput(serializers.Serializer):
    # "from" is a Python keyword: the field is named in the constructor.
    to = serializers.DateTimeField()
    parts = serializers.ListField(child=serializers.IntegerField())

    def get_fields(self) -> dict[str, serializers.Field]:
        return {"from": serializers.DateTimeField(), **super().get_fields()}


class WhyExpectedOutput(ExpectedSecondsOutput):
    size_text = serializers.CharField(
        allow_null=True, help_text='Its size as read from its body ("362 frames, 30 steps").'
    )
    text = serializers.CharField(help_text="The figures and their basis, in a sentence.")


class WhyOutput(serializers.Serializer):
    job = serializers.IntegerField()
    status = serializers.ChoiceField(choices=JobStatus.choices)
    model = serializers.CharField()
    gpu = serializers.CharField(
        allow_null=True,
        help_text="The GPU whose timeline the parts tell: the one it ran on, or is expected on.",
    )
    other_gpus = WhyOtherGpuOutput(many=True, help_text="What every other GPU did meanwhile.")
    foreign_load = WhyForeignLoadOutput(
        many=True,
        help_text="While it waits: the GPUs that could run it whose llama-swap is also "
        "serving requests that did not come through gpusched, now.",
    )
    swap = SwapOutput(
        allow_null=True,
        help_text="What llama-swap's routing was predicted to load and unload at its start.",
    )
    cut_by_unload = WhyCutOutput(
        many=True,
        help_text="Its runs that llama-swap cut by unloading its model: each sent it back "
        "to the queue once, not failed.",
    )
    band = serializers.IntegerField()
    submitted_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)
    still_waiting = serializers.BooleanField()
    wait_deadline = serializers.DateTimeField(
        allow_null=True, help_text="Its wait bound as a time; past it, queued, it expires."
    )
    as_of = serializers.DateTimeField(
        help_text="The instant the answer is told at: now, or the `as_of` asked for."
    )
    measured_wait_seconds = serializers.FloatField(
        help_text="From submission to start (or to now, or to its cancel or expiry), to the "
        "millisecond; the parts' `seconds` and `swap_seconds` add up to it."
    )
    shown_wait_seconds = serializers.FloatField(
        help_text="The wait to the tenth, as people are shown it; the parts' `shown_seconds` "
        "add up to it."
    )
    parts = serializers.ListField(
        child=serializers.DictField(child=serializers.JSONField()),
        help_text="The wait split into parts that add up to it (docs/concepts/wait-cut.md).",
    )
    parts_total_seconds = serializers.FloatField()
    adds_up = serializers.BooleanField(
        help_text="Whether the pieces tiled the wait; false is a defect, logged with the job's id."
    )
    pieces = WhyPieceOutput(
        many=True,
        help_text="The wait cut once: its stretches in order, each with the parts (indices into "
        "`parts`) that shared it equally.",
    )
    own_swap_seconds = serializers.FloatField(allow_null=True)
    expected = WhyExpectedOutput(
        help_text="What its run was expected to take at its submission, and on what that rests."
    )
    summary = serializers.CharField()
