"""The operator's admin. Actions and saves go through services."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.db.models import Count, Max, Q, QuerySet
from django.db.models.functions import Now
from django.forms import ModelForm
from django.http import HttpRequest

from gpusched.version import version
from queueapp import (
    admin_audit,  # noqa: F401  registers the audit's pages
    admin_models,  # noqa: F401  registers the models' and run statistics' pages
    services,
)
from queueapp.errors import GpuschedError
from queueapp.models import (
    Gpu,
    Job,
    JobEvent,
    JobStatus,
    Member,
    Policy,
    Tier,
    WebhookAttempt,
    WebhookDelivery,
)
from queueapp.policy import PolicyInvariantError, PolicySettings, check_invariant
from queueapp.policy.priority import PathBandsInvalid, path_bands
from queueapp.policy.wait_bound import WaitBoundInvalid, band_defaults
from queueapp.selectors import gpu_busy_seconds, tier_bonuses
from queueapp.upstream.client import FRONT_DOOR_PATHS
from queueapp.webhooks.delivery import webhook_redeliver

# The release in every admin page's header: an operator sees what runs.
admin.site.site_header = f"gpusched {version()}"
admin.site.site_title = "gpusched admin"


class TierForm(ModelForm):
    class Meta:
        model = Tier
        fields = [
            "name",
            "bonus",
            "priority_cap",
            "priority_floor",
            "max_queued_jobs",
            "max_running_jobs",
            "strict_running_limit",
        ]

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        proposed = Tier(
            pk=self.instance.pk, name=cleaned.get("name") or "?", bonus=cleaned.get("bonus") or 0
        )
        try:
            services.tier_check(proposed)
        except PolicyInvariantError as exc:
            raise ValidationError(str(exc)) from exc
        if (cleaned.get("priority_floor") or 0) > (cleaned.get("priority_cap") or 0):
            raise ValidationError("priority_floor must not be above priority_cap")
        return cleaned


@admin.register(Tier)
class TierAdmin(admin.ModelAdmin):
    form = TierForm
    list_display = ["name", "bonus", "priority_cap", "priority_floor", "max_queued_jobs"]

    def save_model(self, request: HttpRequest, obj: Tier, form: ModelForm, change: bool) -> None:
        services.tier_save(tier=obj, by=f"admin:{request.user}")


DEFAULT_SCALE = PolicySettings().shortest_first_scale


class PolicyForm(ModelForm):
    class Meta:
        model = Policy
        fields = Policy.EDITABLE_FIELDS

    def clean_max_wait_by_band(self) -> dict[str, float]:
        try:
            return band_defaults(self.cleaned_data.get("max_wait_by_band"))
        except WaitBoundInvalid as exc:
            raise ValidationError(str(exc)) from exc

    def clean_priority_by_path(self) -> dict[str, int]:
        try:
            return path_bands(
                self.cleaned_data.get("priority_by_path"), known_paths=FRONT_DOOR_PATHS
            )
        except PathBandsInvalid as exc:
            raise ValidationError(str(exc)) from exc

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        candidate = PolicySettings(
            aging_divisor=cleaned.get("aging_divisor") or 0,
            swap_affinity_bonus=cleaned.get("swap_affinity_bonus") or 0,
            band_spacing=cleaned.get("band_spacing") or 0,
            # A field left out is refused on its own: not one of the invariant's.
            shortest_first_weight=cleaned.get("shortest_first_weight") or 0,
            shortest_first_scale=cleaned.get("shortest_first_scale") or DEFAULT_SCALE,
        )
        try:
            check_invariant(candidate, tier_bonuses())
        except PolicyInvariantError as exc:
            raise ValidationError(str(exc)) from exc
        return cleaned


@admin.register(Policy)
class PolicyAdmin(admin.ModelAdmin):
    form = PolicyForm
    list_display = ["__str__", *Policy.EDITABLE_FIELDS]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return not Policy.objects.exists()

    def has_delete_permission(self, request: HttpRequest, obj: Policy | None = None) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: Policy, form: ModelForm, change: bool) -> None:
        services.policy_update(changes={f: getattr(obj, f) for f in Policy.EDITABLE_FIELDS})


@admin.register(Member)
class MemberAdmin(admin.ModelAdmin):
    list_display = ["name", "tier", "is_staff", "created_at"]
    list_filter = ["tier", "is_staff"]
    search_fields = ["name"]
    fields = ["name", "tier", "is_staff", "webhook_secret"]
    readonly_fields = ["webhook_secret"]
    actions = ["rotate_token", "rotate_webhook_secret"]

    def save_model(self, request: HttpRequest, obj: Member, form: ModelForm, change: bool) -> None:
        if change:
            services.member_save(member=obj, by=f"admin:{request.user.get_username()}")
            return
        member, token = services.member_create(name=obj.name, tier=obj.tier, is_staff=obj.is_staff)
        obj.pk = member.pk
        self.message_user(request, f"API token for {member.name} (shown once): {token}")

    @admin.action(description="Rotate API token (shows the new token once)")
    def rotate_token(self, request: HttpRequest, queryset: QuerySet[Member]) -> None:
        for member in queryset:
            token = services.member_token_rotate(member=member)
            self.message_user(request, f"New API token for {member.name}: {token}")

    @admin.action(description="Rotate webhook secret")
    def rotate_webhook_secret(self, request: HttpRequest, queryset: QuerySet[Member]) -> None:
        for member in queryset:
            services.member_webhook_secret_rotate(member=member)
        self.message_user(request, f"Rotated {queryset.count()} webhook secret(s).")


class JobEventInline(admin.TabularInline):
    model = JobEvent
    extra = 0
    can_delete = False
    readonly_fields = ["at", "kind", "detail"]

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


class ChainFilter(admin.SimpleListFilter):
    """In a chain, not in one, or one chain: the most recent chains by name."""

    title = "chain"
    parameter_name = "chain"
    # Chains offered by name; older ones are found with the search box.
    RECENT_CHAINS = 20
    # Prefix of one chain's value, so a chain named "any" or "none" is not
    # taken for the two choices above it.
    ONE_CHAIN = "id:"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple]:
        recent = list(
            Job.objects.exclude(chain_id="")
            .values("chain_id")
            .annotate(latest=Max("id"))
            .order_by("-latest")
            .values_list("chain_id", flat=True)[: self.RECENT_CHAINS]
        )
        chosen = self._chain_id()
        if chosen is not None and chosen not in recent:
            recent.append(chosen)  # an older chain followed by a link stays shown as chosen
        return [
            ("any", "in a chain"),
            ("none", "not in a chain"),
            *((f"{self.ONE_CHAIN}{chain_id}", chain_id) for chain_id in recent),
        ]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Job]) -> QuerySet[Job]:
        if self.value() == "any":
            return queryset.exclude(chain_id="")
        if self.value() == "none":
            return queryset.filter(chain_id="")
        chain_id = self._chain_id()
        if chain_id is not None:
            return queryset.filter(chain_id=chain_id)
        return queryset

    def _chain_id(self) -> str | None:
        value = self.value()
        if value and value.startswith(self.ONE_CHAIN):
            return value.removeprefix(self.ONE_CHAIN)
        return None


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    list_display = [
        "id",
        "member",
        "model",
        "path",
        "priority",
        "status",
        "gpu",
        "chain_id",
        "submitted_at",
        "started_at",
    ]
    list_filter = ["status", "gpu", "priority", "model", "member__tier", "member", ChainFilter]
    search_fields = ["=id", "member__name", "model", "chain_id"]
    readonly_fields = [f.name for f in Job._meta.fields]
    list_select_related = ["member", "gpu"]
    inlines = [JobEventInline]
    actions = ["cancel_jobs", "requeue_jobs"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    @admin.action(description="Cancel the selected queued jobs")
    def cancel_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        self._each(request, queryset, services.job_cancel)

    @admin.action(description="Re-queue the selected finished jobs (as if submitted now)")
    def requeue_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> None:
        self._each(request, queryset, services.job_requeue)

    def _each(self, request: HttpRequest, queryset: QuerySet[Job], service: Callable) -> None:
        """Apply a job service to each selected job; refusals become warnings."""
        for job in queryset:
            try:
                service(job=job, by=f"admin:{request.user}")
            except GpuschedError as exc:
                self.message_user(request, exc.message, level=messages.WARNING)


@admin.register(Gpu)
class GpuAdmin(admin.ModelAdmin):
    """The GPUs (each registered by its dispatcher): enable, disable, narrow
    the models it runs; its figures over the last hour on the changelist."""

    list_display = [
        "name",
        "enabled",
        "reachable",
        "resident_model",
        "reservation",
        "one_model_at_a_time",
        "running_job",
        "dispatches_last_hour",
        "swaps_last_hour",
        "busy_share_last_hour",
        "checked_at",
    ]
    list_filter = ["enabled", "reachable", "one_model_at_a_time"]
    fields = [
        "name",
        "url",
        "enabled",
        "allowed_models",
        "min_band",
        "max_expected_seconds",
        "one_model_at_a_time",
        "served_models",
        "resident_model",
        "routing_error",
    ]
    readonly_fields = ["name", "url", "served_models", "resident_model", "routing_error"]
    actions = ["enable_gpus", "disable_gpus"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # a dispatcher registers its GPU (manage.py dispatcher)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Gpu]:
        hour_ago = Now() - timedelta(hours=1)
        recent = Q(decisions__at__gte=hour_ago)
        return (
            super()
            .get_queryset(request)
            .annotate(
                recent_dispatches=Count("decisions", filter=recent),
                recent_swaps=Count("decisions", filter=recent & Q(decisions__swap_needed=True)),
            )
        )

    @admin.display(description="running jobs")
    def running_job(self, obj: Gpu) -> str:
        running = obj.jobs.filter(status=JobStatus.RUNNING).order_by("gpu_slot")
        return ", ".join(str(pk) for pk in running.values_list("pk", flat=True)) or "—"

    @admin.display(description="dispatches (1 h)", ordering="recent_dispatches")
    def dispatches_last_hour(self, obj: Gpu) -> int:
        return getattr(obj, "recent_dispatches", 0)

    @admin.display(description="swaps (1 h)", ordering="recent_swaps")
    def swaps_last_hour(self, obj: Gpu) -> int:
        return getattr(obj, "recent_swaps", 0)

    @admin.display(description="busy (1 h)")
    def busy_share_last_hour(self, obj: Gpu) -> str:
        return f"{gpu_busy_seconds(obj, window_seconds=3600) / 3600:.0%}"

    @admin.display(description="reservation")
    def reservation(self, obj: Gpu) -> str:
        rules = []
        if obj.min_band is not None:
            rules.append(f"band ≥ {obj.min_band}")
        if obj.max_expected_seconds is not None:
            rules.append(f"expected < {obj.max_expected_seconds:g} s")
        return " or ".join(rules) or "—"

    def save_model(self, request: HttpRequest, obj: Gpu, form: ModelForm, change: bool) -> None:
        self._update(obj, enabled=obj.enabled)

    @admin.action(description="Enable the selected GPUs")
    def enable_gpus(self, request: HttpRequest, queryset: QuerySet[Gpu]) -> None:
        for gpu in queryset:
            self._update(gpu, enabled=True)

    @admin.action(description="Disable the selected GPUs (each finishes its job, claims no more)")
    def disable_gpus(self, request: HttpRequest, queryset: QuerySet[Gpu]) -> None:
        for gpu in queryset:
            self._update(gpu, enabled=False)

    def _update(self, gpu: Gpu, *, enabled: bool) -> None:
        services.gpu_update(
            gpu=gpu,
            enabled=enabled,
            allowed_models=gpu.allowed_models,
            min_band=gpu.min_band,
            max_expected_seconds=gpu.max_expected_seconds,
            one_model_at_a_time=gpu.one_model_at_a_time,
        )


class WebhookAttemptInline(admin.TabularInline):
    model = WebhookAttempt
    extra = 0
    can_delete = False
    readonly_fields = ["at", "status_code", "duration_ms", "error"]

    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(admin.ModelAdmin):
    """The delivery log; the one action is to send again."""

    list_display = ["id", "job", "event_type", "status", "attempts", "next_attempt_at", "url"]
    list_filter = ["status", "event_type"]
    search_fields = ["webhook_id", "url", "job__id"]
    readonly_fields = [f.name for f in WebhookDelivery._meta.fields]
    inlines = [WebhookAttemptInline]
    actions = ["redeliver"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    @admin.action(description="Deliver again (same webhook-id)")
    def redeliver(self, request: HttpRequest, queryset: QuerySet[WebhookDelivery]) -> None:
        for delivery in queryset:
            webhook_redeliver(delivery=delivery)
        self.message_user(request, f"{queryset.count()} delivery(ies) queued again.")
