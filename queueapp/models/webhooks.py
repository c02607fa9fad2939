"""Webhook deliveries, their attempts, and callback URLs that answered 410."""

from __future__ import annotations

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from queueapp.job_body import MAX_CALLBACK_URL
from queueapp.models.jobs import Job
from queueapp.models.members import Member


class WebhookStatus(models.TextChoices):
    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"  # retries exhausted, or refused by the SSRF guard
    DISABLED = "disabled"  # the receiver answered 410 Gone for this URL


class WebhookDelivery(models.Model):
    """One event for one job's callback URL; retried under the same webhook-id."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="webhooks")
    event_type = models.CharField(max_length=40)
    webhook_id = models.CharField(max_length=64, unique=True)
    url = models.URLField(max_length=MAX_CALLBACK_URL)
    payload = models.JSONField()
    status = models.CharField(max_length=16, choices=WebhookStatus, default=WebhookStatus.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    # Due time; a worker that takes the delivery pushes it forward first, so a
    # worker that dies mid-attempt leaves it due again later, not lost.
    next_attempt_at = models.DateTimeField(db_default=Now())
    created_at = models.DateTimeField(db_default=Now())
    delivered_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)

    class Meta:
        ordering = ["-id"]
        indexes = [
            models.Index(
                "next_attempt_at", name="webhook_due", condition=Q(status=WebhookStatus.PENDING)
            ),
        ]

    def __str__(self) -> str:
        return f"{self.event_type} for job {self.job_id} ({self.status})"


class WebhookAttempt(models.Model):
    delivery = models.ForeignKey(
        WebhookDelivery, on_delete=models.CASCADE, related_name="attempt_log"
    )
    at = models.DateTimeField(db_default=Now())
    status_code = models.IntegerField(null=True, blank=True)
    duration_ms = models.FloatField(null=True, blank=True)
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"attempt {self.pk}: {self.status_code or self.error}"


class DisabledCallback(models.Model):
    """A callback URL whose receiver answered 410 Gone: no more deliveries."""

    member = models.ForeignKey(Member, on_delete=models.CASCADE, related_name="disabled_callbacks")
    url = models.URLField(max_length=MAX_CALLBACK_URL)
    disabled_at = models.DateTimeField(db_default=Now())

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["member", "url"], name="disabled_callback_once"),
        ]

    def __str__(self) -> str:
        return self.url
