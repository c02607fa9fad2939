"""The admin's pages of the models: what the operator sets per model
(`ModelSetting`) and what its runs took (`RunStats`, read-only). Saves go
through services; queueapp/admin.py imports this module to register them."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.core.exceptions import ValidationError
from django.forms import ModelForm
from django.http import HttpRequest

from queueapp import selectors, services
from queueapp.errors import GpuschedError
from queueapp.models import Job, JobStatus, ModelSetting, OnCallerGone, RunStats
from queueapp.models.model_settings import SHOWN_FIELDS


class ModelSettingForm(ModelForm):
    class Meta:
        model = ModelSetting
        fields = ["name", "operator_parallel", "on_caller_gone", "typical_seconds"]

    def clean_name(self) -> str:
        name = (self.cleaned_data.get("name") or "").strip()
        if self.instance.pk is None:
            try:
                services.model_served_check(name)
            except GpuschedError as exc:
                raise ValidationError(exc.message) from exc
        return name

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        parallel = cleaned.get("operator_parallel")
        # The changelist's form has no name field: the row's own.
        name = cleaned.get("name") or self.instance.name
        if parallel is not None and name and "operator_parallel" in self.changed_data:
            try:
                services.model_parallel_check(name=name, parallel=parallel)
            except GpuschedError as exc:
                self.add_error("operator_parallel", exc.message)
        return cleaned


@admin.register(ModelSetting)
class ModelSettingAdmin(admin.ModelAdmin):
    """How many jobs of a model one GPU runs at once (`parallel`, and where
    it comes from; the operator's `operator_parallel` wins over its servers'
    slots), what a front-door caller's hang-up does to its running request
    (`on_caller_gone`; blank: by path), and what a run typically takes until
    runs are learned (`typical_seconds`). Saves go through the service,
    which refuses a model no GPU serves."""

    form = ModelSettingForm
    list_display = ["name", *SHOWN_FIELDS, "gpus", "in_flight", "updated_at"]
    list_editable = ["operator_parallel", "on_caller_gone", "typical_seconds"]
    fields = ["name", *SHOWN_FIELDS]

    def formfield_for_choice_field(self, db_field: Any, request: HttpRequest, **kwargs: Any) -> Any:
        if db_field.name == "on_caller_gone":
            kwargs["choices"] = [
                ("", "by path (drain for images, audio and /sdapi/; close otherwise)"),
                *OnCallerGone.choices,
            ]
        return super().formfield_for_choice_field(db_field, request, **kwargs)

    def get_readonly_fields(self, request: HttpRequest, obj: ModelSetting | None = None) -> list:
        worked_out = ["parallel", "parallel_source"]  # model_parallels_refresh writes them
        return ["name", *worked_out] if obj is not None else worked_out

    def get_changelist_form(self, request: HttpRequest, **kwargs: Any) -> Any:
        # The list's editable `operator_parallel` is checked as the change form's is.
        return super().get_changelist_form(request, form=ModelSettingForm, **kwargs)

    @admin.display(description="GPUs that run it")
    def gpus(self, obj: ModelSetting) -> str:
        return (
            ", ".join(
                gpu.name for gpu in selectors.gpus_list() if obj.name in (gpu.runs_models() or [])
            )
            or "—"
        )

    @admin.display(description="running now")
    def in_flight(self, obj: ModelSetting) -> int:
        return Job.objects.filter(status=JobStatus.RUNNING, model=obj.name).count()

    def save_model(
        self, request: HttpRequest, obj: ModelSetting, form: ModelForm, change: bool
    ) -> None:
        changes: dict[str, Any] = {
            "on_caller_gone": obj.on_caller_gone,
            "typical_seconds": obj.typical_seconds,
        }
        if not change or "operator_parallel" in form.changed_data:
            # Only a changed one is checked: a setting a reloaded config has
            # put above its limit does not block a change of on_caller_gone.
            changes["parallel"] = obj.operator_parallel
        saved = services.model_setting_update(name=obj.name, changes=changes)
        obj.pk = saved.pk


@admin.register(RunStats)
class RunStatsAdmin(admin.ModelAdmin):
    """Learned durations behind the estimates, per concurrency level (jobs
    sharing the GPU as the run started): read-only."""

    list_display = [
        "model",
        "path",
        "concurrency",
        "warm_seconds",
        "warm_samples",
        "cold_seconds",
        "cold_samples",
    ]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False
