"""The dispatch audit in the admin, read-only: every decision, and why each
idle GPU stands idle. Registered by queueapp/admin.py, which imports it."""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest

from queueapp.models import DispatchDecision, GpuIdle


class ReadOnlyAdmin(admin.ModelAdmin):
    """An audit: nothing added, changed or deleted here."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


@admin.register(DispatchDecision)
class DispatchDecisionAdmin(ReadOnlyAdmin):
    """The audit of every dispatch: read-only."""

    list_display = [
        "id",
        "at",
        "job",
        "gpu",
        "gpu_slot",
        "in_flight",
        "resident_model",
        "swap_needed",
        "effective",
    ]
    list_filter = ["gpu", "swap_needed", "resident_model"]

    @admin.display(description="effective score")
    def effective(self, obj: DispatchDecision) -> float:
        return obj.terms.get("effective")


@admin.register(GpuIdle)
class GpuIdleAdmin(ReadOnlyAdmin):
    """Why each idle GPU stands idle: the latest pass that started nothing
    on it (policy/skip_record.py), read-only."""

    list_display = ["gpu", "since", "at", "skipped", "capped_members"]
    list_filter = []

    @admin.display(description="heads skipped, by reason")
    def skipped(self, obj: GpuIdle) -> str:
        return ", ".join(f"{kind} {count}" for kind, count in obj.skips["skipped"].items()) or "-"

    @admin.display(description="members at their running limit")
    def capped_members(self, obj: GpuIdle) -> str:
        return ", ".join(str(member) for member in obj.skips["capped_members"]) or "-"
