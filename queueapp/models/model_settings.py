"""What the operator sets per model: its parallel slots and what a front-door
caller's hang-up does to its running request."""

from __future__ import annotations

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from queueapp.job_body import MAX_MODEL_NAME
from queueapp.policy.occupancy import MAX_PARALLEL
from queueapp.policy.server_slots import ParallelSource

# A day: a typical run longer than that is a typing error.
MAX_TYPICAL_SECONDS = 86_400.0
# The paths whose servers keep rendering after their client left.
RENDERING_PATH_PREFIXES = ("/v1/images/", "/v1/audio/", "/sdapi/")


class OnCallerGone(models.TextChoices):
    """What becomes of a front-door call's request to llama-swap when its
    caller hangs up while it runs."""

    # Close the upstream request: llama-server stops generating at once.
    CLOSE = "close"
    # Read llama-swap's answer to its end and discard it, the GPU held until
    # then: image, audio and video servers finish a render whose client left.
    DRAIN = "drain"

    @classmethod
    def by_path(cls, path: str) -> OnCallerGone:
        """The default for a model the operator set nothing for, by the path called."""
        return cls.DRAIN if path.startswith(RENDERING_PATH_PREFIXES) else cls.CLOSE


# A model's settings as the admin and `GET /api/models/` show them, in order.
SHOWN_FIELDS = (
    "parallel",
    "parallel_source",
    "operator_parallel",
    "on_caller_gone",
    "typical_seconds",
)


class ModelSetting(models.Model):
    """What the operator sets for one model (by the name jobs give it), and
    the slots its servers have.

    `parallel`: how many of its jobs a GPU with it loaded runs at once (a
    batching server: llama.cpp's `--parallel N`, vLLM). 1, the default and
    the rule for a model without a row, is one job at a time. It is worked
    out, never typed in: `operator_parallel` when set, else what the GPUs'
    servers and configs say (`Gpu.model_slots`), bounded by the model's
    concurrencyLimit, by `services.model_parallels_refresh`, which alone
    writes it (queueapp/policy/server_slots.py). `parallel_source` says
    which of these it is.

    `on_caller_gone`: what a front-door caller's hang-up does to its running
    request (`OnCallerGone`); blank, the default and the rule for a model
    without a row, follows the path (`OnCallerGone.by_path`).
    `typical_seconds`: a run's seconds before any is learned (the estimate's
    `operator` basis, queueapp/policy/expected.py); blank: unknown.
    """

    name = models.CharField(max_length=MAX_MODEL_NAME, unique=True)
    parallel = models.PositiveSmallIntegerField(
        default=1,
        validators=[MinValueValidator(1), MaxValueValidator(MAX_PARALLEL)],
        help_text="Jobs of this model one GPU runs at once while it is loaded: the "
        "operator's value, else the server's slots, else its config's flag, else 1.",
    )
    parallel_source = models.CharField(
        max_length=8,
        choices=[(source.value, source.value) for source in ParallelSource],
        db_default=ParallelSource.DEFAULT.value,
        default=ParallelSource.DEFAULT.value,
        help_text="Where parallel comes from: operator, server (its /props), config (-np, "
        "--parallel, --max-num-seqs, LLAMA_ARG_N_PARALLEL) or default (1).",
    )
    operator_parallel = models.PositiveSmallIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1), MaxValueValidator(MAX_PARALLEL)],
        help_text="Set: jobs of this model one GPU runs at once, whatever its servers say "
        "(set it to what the server answers at once). Blank: as the servers say.",
    )
    on_caller_gone = models.CharField(
        max_length=8,
        choices=OnCallerGone,
        blank=True,
        default="",
        help_text="When a front-door caller hangs up mid-run: close (the request is closed; "
        "llama-server stops) or drain (llama-swap's answer is read to its end and discarded, "
        "the GPU held until then). Blank: drain for images, audio and /sdapi/, close for "
        "the other paths.",
    )
    typical_seconds = models.FloatField(
        null=True,
        blank=True,
        validators=[MinValueValidator(0.01), MaxValueValidator(MAX_TYPICAL_SECONDS)],
        help_text="What a run of this model typically takes, in seconds: the estimate until "
        "its runs are learned. Blank: unknown until then (an ETA is then a guess).",
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        verbose_name = "model"

    def __str__(self) -> str:
        return self.name
