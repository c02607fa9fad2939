"""The output shape of `GET /api/jobs/{id}/why/`, for the OpenAPI schema
(the answer is rendered by queueapp/why/; queueapp/api/schema.py holds the
other shapes and says how they are checked)."""

from __future__ import annotations

from rest_framework import serializers

from queueapp.api.schema import ExpectedSecondsOutput, SwapOutput
from queueapp.models import JobStatus


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
    measured_wait_seconds = serializers.FloatField()
    parts = serializers.ListField(
        child=serializers.DictField(child=serializers.JSONField()),
        help_text="The wait split into parts that add up to it.",
    )
    parts_total_seconds = serializers.FloatField()
    own_swap_seconds = serializers.FloatField(allow_null=True)
    expected = WhyExpectedOutput(
        help_text="What its run was expected to take at its submission, and on what that rests."
    )
    summary = serializers.CharField()
