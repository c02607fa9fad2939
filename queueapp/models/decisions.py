"""The dispatch audit: why each job was started."""

from __future__ import annotations

from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models.functions import Now

from queueapp.job_body import MAX_MODEL_NAME
from queueapp.models.gpus import Gpu
from queueapp.models.jobs import Job


class DispatchDecision(models.Model):
    """Why a job was started: its terms and those of the runners-up."""

    at = models.DateTimeField(db_default=Now())
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="decisions")
    gpu = models.ForeignKey(
        Gpu,
        null=True,
        on_delete=models.PROTECT,
        related_name="decisions",
        help_text="The GPU the job was started on; the candidates are those it could run.",
    )
    band = models.IntegerField(help_text="The chosen job's band.")
    terms = models.JSONField()
    candidates = models.JSONField(help_text="The leading candidates, best first, with terms.")
    resident_model = models.CharField(max_length=MAX_MODEL_NAME, blank=True)
    resident_models = ArrayField(
        models.CharField(max_length=MAX_MODEL_NAME),
        db_default=[],  # a previous release's claim writes its rows without it
        default=list,
        blank=True,
        help_text="Every model llama-swap had ready on an idle GPU, when affinity was scored "
        "for them all; empty: for the resident model alone.",
    )
    swap_needed = models.BooleanField()
    swap = models.JSONField(
        null=True,
        blank=True,
        help_text='The swap predicted by llama-swap\'s routing: {"loads": model or null, '
        '"unloads": [model, ...]}; null when the job needed none.',
    )
    policy = models.JSONField(help_text="The policy settings in force.")
    counterfactuals = models.JSONField(
        default=dict, help_text="Per term: the job that would have won without it."
    )
    # Whether removing the term would have started another job; columns, so
    # the per-band figures are a GROUP BY.
    changed_by_aging = models.BooleanField(default=False)
    changed_by_swap_affinity = models.BooleanField(default=False)
    changed_by_tier_bonus = models.BooleanField(default=False)
    changed_by_fairness = models.BooleanField(default=False)
    idle_seconds = models.FloatField(
        null=True, help_text="How long the GPU stood idle before this dispatch."
    )
    gpu_slot = models.PositiveSmallIntegerField(
        db_default=0, help_text="The slot the job took (a model with parallel > 1)."
    )
    in_flight = models.PositiveSmallIntegerField(
        db_default=1, help_text="Jobs running on the GPU as it started, itself included."
    )
    skips = models.JSONField(
        null=True,
        help_text="Why the other queued heads did not start here (dispatch/skip_reasons.py); "
        "null on decisions recorded before reasons were kept.",
    )
    idle_reason = models.JSONField(
        null=True,
        help_text="Why the GPU stood idle before this start, when it did: its GpuIdle record.",
    )
    borrowed = models.BooleanField(
        db_default=False,
        help_text="Started past its member's running limit on a GPU no other job could use.",
    )

    class Meta:
        ordering = ["-id"]
        indexes = [
            models.Index(fields=["at"], name="decision_at"),
            # A GPU's last dispatch (its idle gap before the next).
            models.Index(fields=["gpu", "-id"], name="decision_gpu_latest"),
        ]

    def __str__(self) -> str:
        return f"decision {self.pk}: job {self.job_id}"

    @property
    def loaded(self) -> str | frozenset[str] | None:
        """What swap affinity was scored for (policy/score.py `Loaded`)."""
        if self.resident_models:
            return frozenset(self.resident_models)
        return self.resident_model or None


class GpuIdle(models.Model):
    """Why a GPU stands idle now: the latest dispatch pass that started
    nothing on it, one row per GPU (not one per pass). `since`: the first
    pass that found the same members held at their running limit. The
    start that ends the idle stretch moves it into its decision's
    `idle_reason`."""

    gpu = models.OneToOneField(
        Gpu, primary_key=True, on_delete=models.CASCADE, related_name="idle_reason"
    )
    since = models.DateTimeField()
    at = models.DateTimeField(help_text="The latest pass that found these reasons.")
    skips = models.JSONField(help_text="As DispatchDecision.skips.")

    class Meta:
        verbose_name = "idle GPU"
        verbose_name_plural = "idle GPUs"

    def __str__(self) -> str:
        return f"{self.gpu_id} idle since {self.since}"
