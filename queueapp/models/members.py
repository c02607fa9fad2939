"""Who submits: members and the tiers that bound them."""

from __future__ import annotations

import base64
import hashlib
import secrets

from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Q
from django.db.models.functions import Now


class Tier(models.Model):
    name = models.CharField(max_length=32, unique=True)
    bonus = models.FloatField(default=0, help_text="Points added to every job of this tier.")
    priority_cap = models.IntegerField(
        default=100, help_text="Highest priority a member of this tier may apply."
    )
    priority_floor = models.IntegerField(
        default=-1000, help_text="Lowest priority a member of this tier may apply."
    )
    max_queued_jobs = models.PositiveIntegerField(
        default=1000, help_text="Queued jobs one member may have; more are refused with 429."
    )
    max_running_jobs = models.PositiveIntegerField(
        default=1,
        # 0 would read as "hold this tier's jobs", which nothing enforces:
        # refused rather than silently ignored.
        validators=[
            MinValueValidator(
                1,
                message="must be at least 1: a tier's jobs cannot be held with this limit "
                "(to hold every queued job, pause dispatch in the policy)",
            )
        ],
        help_text="GPUs one member's running jobs may hold at once, at least 1 (jobs "
        "sharing a GPU's slots hold one); the member's other jobs wait, and say so. A "
        "share under contention: a GPU no other member's job can use is lent past it "
        "(see the policy's borrowing guard), unless strict_running_limit is set.",
    )
    strict_running_limit = models.BooleanField(
        default=False,
        help_text="Never lend this tier's members a GPU past max_running_jobs, even one "
        "that would otherwise stand idle.",
    )

    class Meta:
        ordering = ["bonus", "name"]
        constraints = [
            models.CheckConstraint(
                condition=Q(max_running_jobs__gte=1),
                name="tier_max_running_jobs_at_least_one",
                violation_error_message="max_running_jobs must be at least 1",
            ),
        ]

    def __str__(self) -> str:
        return self.name


def new_webhook_secret() -> str:
    # Standard Webhooks: "whsec_" and the base64 (not URL-safe) of the key.
    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Member(models.Model):
    name = models.CharField(max_length=150, unique=True)
    tier = models.ForeignKey(Tier, on_delete=models.PROTECT, related_name="members")
    # Only a hash is kept: a leaked database does not leak working tokens.
    token_hash = models.CharField(max_length=64, unique=True, editable=False)
    webhook_secret = models.CharField(max_length=80, default=new_webhook_secret)
    is_staff = models.BooleanField(default=False)
    created_at = models.DateTimeField(db_default=Now())

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    # DRF's IsAuthenticated asks the authenticated principal this.
    is_authenticated = True
