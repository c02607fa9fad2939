"""The learned durations that estimates read."""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now

from queueapp.job_body import MAX_JOB_PATH, MAX_MODEL_NAME


class RunStats(models.Model):
    """What jobs of one model and path take, learned from finished jobs.

    Decayed averages: `warm_seconds` from runs without a model swap,
    `cold_seconds` from runs that needed one; their difference is the swap cost.
    """

    model = models.CharField(max_length=MAX_MODEL_NAME)
    path = models.CharField(max_length=MAX_JOB_PATH)
    warm_seconds = models.FloatField(null=True)
    warm_samples = models.PositiveIntegerField(default=0)
    cold_seconds = models.FloatField(null=True)
    cold_samples = models.PositiveIntegerField(default=0)
    # Jobs sharing the GPU as the run started, itself included (a model with
    # parallel > 1): each level has averages of its own.
    concurrency = models.PositiveSmallIntegerField(db_default=1)
    updated_at = models.DateTimeField(db_default=Now())
    # The decayed sums of its sized runs alone (concurrency 1), whose line
    # gives a run's seconds from its size (queueapp/policy/size_fit.py):
    # weight, ln size, ln seconds, and their squares and product.
    fit_weight = models.FloatField(db_default=0.0, default=0.0)
    fit_x = models.FloatField(db_default=0.0, default=0.0)
    fit_y = models.FloatField(db_default=0.0, default=0.0)
    fit_xx = models.FloatField(db_default=0.0, default=0.0)
    fit_xy = models.FloatField(db_default=0.0, default=0.0)
    fit_yy = models.FloatField(db_default=0.0, default=0.0)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["model", "path", "concurrency"], name="runstats_model_path_concurrency"
            ),
        ]
        verbose_name_plural = "run statistics"

    def __str__(self) -> str:
        return f"{self.model} {self.path}"
