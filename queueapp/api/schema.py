"""Output shapes, for the OpenAPI schema.

The views render plain dicts (queueapp/rendering.py, the queue state,
job_why, ...); these serializers only describe them, except `MeOutput`, which
renders the caller. tests/security/test_schema_fuzz.py checks every answer
against the schema, so a description that drifts from what is rendered fails
a test.
"""

from __future__ import annotations

from rest_framework import serializers

from queueapp.dashboard import MEMBERS_SHOWN
from queueapp.models import JobStatus, Member, OnCallerGone
from queueapp.policy.expected import Basis
from queueapp.policy.server_slots import ParallelSource
from queueapp.rendering import GpuHealth


class MeOutput(serializers.ModelSerializer):
    tier = serializers.CharField(source="tier.name")

    class Meta:
        model = Member
        fields = ["name", "tier", "is_staff", "webhook_secret"]


class ErrorOutput(serializers.Serializer):
    detail = serializers.CharField(help_text="What went wrong; a field's name comes first.")
    errors = serializers.JSONField(  # type: ignore[assignment]  # DRF's `errors` property; output-only here, for the schema
        required=False, help_text="Validation errors by field (400 on invalid input only)."
    )
    code = serializers.CharField(
        required=False,
        help_text="A machine-readable reason where one applies: gpu_busy (503) when the job "
        "cannot start within its wait bound.",
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
    basis = serializers.ChoiceField(
        choices=["learned", "guess"],
        required=False,
        help_text="guess: a job that runs before it has no estimate yet (nothing of its "
        "model learned, no typical run set), so the start time is a guess.",
    )
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


class SwapOutput(serializers.Serializer):
    loads = serializers.CharField(
        allow_null=True, help_text="The model llama-swap loads; null: it was running."
    )
    unloads = serializers.ListField(
        child=serializers.CharField(), help_text="The models llama-swap unloads first."
    )


class ExpectedSecondsOutput(serializers.Serializer):
    p50 = serializers.FloatField(
        allow_null=True, help_text="The median of its run seconds, without a swap."
    )
    p90 = serializers.FloatField(allow_null=True, help_text="Its 90th percentile.")
    size = serializers.FloatField(
        allow_null=True,
        help_text="The size read from its body that the estimate used (frames × steps × "
        "megapixels, tokens, characters, bytes: docs/concepts/estimates.md); null when none.",
    )
    basis = serializers.ChoiceField(
        choices=[basis.value for basis in Basis],
        help_text="What the figures rest on: size (its size on its model's learned line), "
        "model (the model's learned mean), operator (the model's typical_seconds) or unknown "
        "(p50 and p90 null).",
    )


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
    wait_deadline = serializers.DateTimeField(
        allow_null=True,
        help_text="Its wait bound (X-Gpusched-Max-Wait, or the band's default) as a time: "
        "queued past it, it ends expired.",
    )
    gpu = serializers.CharField(allow_null=True, help_text="The GPU it runs or ran on.")
    pinned_gpu = serializers.CharField(
        allow_null=True, help_text="The one GPU that may run it (a preload's `gpu`), or null."
    )
    swap = SwapOutput(
        allow_null=True,
        help_text="What llama-swap's routing was predicted to load and unload for its last "
        "start; null when it needed neither.",
    )
    expected_seconds = ExpectedSecondsOutput(
        help_text="How long its run is expected to take, set at submission."
    )
    attempts = serializers.IntegerField()
    result = ResultOutput(allow_null=True)
    error = serializers.CharField(allow_null=True)
    caller_left_at = serializers.DateTimeField(
        allow_null=True,
        help_text="When its front-door caller hung up while it ran; null if it did not.",
    )
    drained_seconds = serializers.FloatField(
        allow_null=True,
        help_text="After its caller left, how long the GPU stayed held while llama-swap's "
        "answer was read to its end (the model's on_caller_gone: drain); null otherwise.",
    )
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
    expired = serializers.IntegerField(help_text="Units whose wait bound passed while queued.")
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
    expired = serializers.IntegerField(
        help_text="Jobs of the band whose wait bound passed while queued, in the window."
    )
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
    preload = serializers.BooleanField(help_text="A job that only loads its model.")
    priority = serializers.IntegerField()
    chain = ChainRefOutput(allow_null=True)
    submitted_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField(allow_null=True)
    wait_deadline = serializers.DateTimeField(
        allow_null=True, help_text="Queued past this (its wait bound), it expires."
    )
    score = serializers.DictField(child=serializers.JSONField())
    why = serializers.CharField()
    estimated_start_at = serializers.DateTimeField(required=False)
    estimate_is_guess = serializers.BooleanField(
        required=False,
        help_text="Queued: its start rests on a job run before it of which nothing is known "
        "(no run of its model learned, no typical run set).",
    )
    expected_gpu = serializers.CharField(
        required=False, allow_null=True, help_text="Queued: the GPU it is expected to run on."
    )
    estimated_end_at = serializers.DateTimeField(required=False)


class QueueDecisionOutput(serializers.Serializer):
    at = serializers.DateTimeField()
    job = serializers.IntegerField()
    member = serializers.CharField(allow_null=True)
    mine = serializers.BooleanField()
    model = serializers.CharField()
    gpu = serializers.CharField(allow_null=True, help_text="The GPU it was dispatched to.")
    band = serializers.IntegerField()
    effective = serializers.FloatField(allow_null=True)
    swap_needed = serializers.BooleanField()
    changed_by = serializers.ListField(child=serializers.CharField())


class QueueChainOutput(ChainOutput):
    member = serializers.CharField(allow_null=True)
    mine = serializers.BooleanField()


class QueueMemberOutput(serializers.Serializer):
    """A member's jobs in the queue; another member's shows no name."""

    member = serializers.CharField(allow_null=True)
    mine = serializers.BooleanField()
    queued = serializers.IntegerField()
    running = serializers.IntegerField()


class UpstreamOutput(serializers.Serializer):
    reachable = serializers.BooleanField(allow_null=True)
    checked_at = serializers.DateTimeField(allow_null=True)
    error = serializers.CharField(allow_null=True)


class GpuReservationOutput(serializers.Serializer):
    min_band = serializers.IntegerField(
        allow_null=True, help_text="It takes jobs of at least this band …"
    )
    max_expected_seconds = serializers.FloatField(
        allow_null=True, help_text="… or of a lower band expected to run under this long."
    )


class GpuOutput(serializers.Serializer):
    name = serializers.CharField()
    enabled = serializers.BooleanField(help_text="Disabled: finishes its job, claims no more.")
    health = serializers.ChoiceField(
        choices=[health.value for health in GpuHealth],
        help_text="In one word: disabled by the operator; no dispatcher holds it (nothing "
        "claims there, and what it last had loaded is not shown); not checked yet; its "
        "llama-swap answered the last check (healthy) or did not (down).",
    )
    healthy = serializers.BooleanField(
        allow_null=True,
        help_text="Its llama-swap answered the last check and a dispatcher holds it; null "
        "before a check.",
    )
    dispatcher_alive = serializers.BooleanField(
        allow_null=True,
        help_text="A live dispatcher holds it (right after a database restart, true until "
        "its dispatcher could have reconnected).",
    )
    resident_model = serializers.CharField(
        allow_null=True, help_text="The model that became ready last."
    )
    resident_models = serializers.ListField(
        child=serializers.CharField(), help_text="Every model llama-swap has ready, sorted."
    )
    loading_models = serializers.ListField(
        child=serializers.CharField(), help_text="Every model llama-swap is starting, sorted."
    )
    foreign_in_flight = serializers.IntegerField(
        help_text="Requests in flight at its llama-swap that did not come through gpusched."
    )
    running_job = serializers.IntegerField(
        allow_null=True, help_text="Its running job (the first, when jobs share it)."
    )
    running_jobs = serializers.ListField(
        child=serializers.IntegerField(), help_text="Every job running on it, by slot."
    )
    busy_models = serializers.DictField(
        child=serializers.IntegerField(),
        help_text="Per model, the gpusched jobs running on it now (co-resident models "
        "run side by side).",
    )
    slots = serializers.IntegerField(
        help_text="Jobs of its loaded model it may run at once (the model's parallel)."
    )
    slots_in_use = serializers.IntegerField()
    models = serializers.ListField(
        child=serializers.CharField(),
        allow_null=True,
        help_text="The models it runs: those llama-swap lists, narrowed by the operator; "
        "null until the list is read (it runs any model then).",
    )
    served_models = serializers.ListField(
        child=serializers.CharField(),
        allow_null=True,
        help_text="The names its llama-swap answers to: what it lists at /v1/models, and "
        "the aliases and setParamsByID keys its config gives them; null until read.",
    )
    allowed_models = serializers.ListField(child=serializers.CharField(), allow_null=True)
    reservation = GpuReservationOutput(
        allow_null=True, help_text="Null: it takes any job of the models it runs."
    )
    checked_at = serializers.DateTimeField(allow_null=True)
    error = serializers.CharField(allow_null=True)
    config_models = serializers.ListField(
        child=serializers.CharField(),
        allow_null=True,
        help_text="The model ids of its llama-swap config (LLAMA_SWAP_CONFIG), sorted; "
        "null without a config, or while it cannot be used.",
    )
    routing_error = serializers.CharField(
        allow_null=True,
        help_text="Why its llama-swap config cannot be used: the file, the key, the reason.",
    )
    one_model_at_a_time = serializers.BooleanField(
        help_text="It runs one model's jobs at a time, whatever llama-swap's routing keeps "
        "loaded together (staff set it with PATCH /api/gpus/{name}/)."
    )
    url = serializers.CharField(required=False, help_text="Its llama-swap (staff only).")


class ModelOutput(serializers.Serializer):
    name = serializers.CharField()
    parallel = serializers.IntegerField(
        help_text="Jobs of this model one GPU runs at once while it is loaded (1: one at a "
        "time), bounded by its concurrencyLimit."
    )
    parallel_source = serializers.ChoiceField(
        choices=[source.value for source in ParallelSource],
        help_text="Where parallel comes from: operator (set here), server (the running "
        "server's slots, llama-server's /props total_slots), config (-np, --parallel, "
        "--max-num-seqs or LLAMA_ARG_N_PARALLEL in its llama-swap cmd or env) or default (1).",
    )
    operator_parallel = serializers.IntegerField(
        allow_null=True,
        help_text="The operator's parallel, which wins over the servers'; null: unset.",
    )
    on_caller_gone = serializers.ChoiceField(
        choices=OnCallerGone.choices,
        allow_null=True,
        help_text="When a front-door caller hangs up while its request runs: close (the "
        "request is closed; llama-server stops) or drain (llama-swap's answer is read to its "
        "end and discarded, the GPU held until then). null: set by path, drain for images, "
        "audio and /sdapi/, close for the others.",
    )
    typical_seconds = serializers.FloatField(
        allow_null=True,
        help_text="What a run typically takes, as the operator set it: the estimate until its "
        "runs are learned; null: unset.",
    )
    gpus = serializers.ListField(child=serializers.CharField(), help_text="The GPUs that run it.")


class QueueOutput(serializers.Serializer):
    as_of = serializers.DateTimeField()
    resident_model = serializers.CharField(allow_null=True, allow_blank=True)
    dispatch_paused = serializers.BooleanField()
    upstream = UpstreamOutput()
    gpus = GpuOutput(many=True)
    running = QueueEntryOutput(allow_null=True, help_text="The first GPU's running job.")
    running_all = QueueEntryOutput(many=True, help_text="Every running job, by GPU.")
    queued = QueueEntryOutput(
        many=True,
        help_text="Queued jobs in forecast dispatch order: the page `offset` and `limit` ask "
        "for (default the first 200).",
    )
    queued_total = serializers.IntegerField()
    bands = BandStatsOutput(many=True)
    members = QueueMemberOutput(
        many=True,
        help_text=f"Members with queued or running jobs, most queued first: the first "
        f"{MEMBERS_SHOWN}, and the caller.",
    )
    members_total = serializers.IntegerField(help_text="Members with queued or running jobs.")
    recent_decisions = QueueDecisionOutput(many=True)
    chains = QueueChainOutput(many=True)


class HealthUpstreamOutput(UpstreamOutput):
    url = serializers.CharField()
    resident_model = serializers.CharField(allow_null=True)


class HealthOutput(serializers.Serializer):
    status = serializers.ChoiceField(choices=["ok", "degraded", "down"])
    database = serializers.CharField()
    problems = serializers.ListField(
        child=serializers.CharField(),
        required=False,
        help_text="Why the status is degraded: each unhealthy GPU by name, with its error.",
    )
    upstream = HealthUpstreamOutput(
        required=False, help_text="The first GPU's llama-swap (the one, on one GPU)."
    )
    gpus = GpuOutput(many=True, required=False)
    queue = serializers.DictField(child=serializers.IntegerField(), required=False)
