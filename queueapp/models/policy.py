"""The operator's scheduling settings: one row."""

from __future__ import annotations

from django.core.validators import MinValueValidator
from django.db import models

from queueapp.policy.priority import default_priority_by_path
from queueapp.policy.running_long import RUNNING_LONG_FACTOR, RUNNING_LONG_MIN_SECONDS


class Policy(models.Model):
    """The operator's settings; one row (pk=1). Read at every dispatch."""

    # What the operator may change (API, admin); every other column is the row's own.
    EDITABLE_FIELDS = (
        "aging_divisor",
        "swap_affinity_bonus",
        "band_spacing",
        "shortest_first_weight",
        "shortest_first_scale",
        "max_attempts",
        "lease_seconds",
        "dispatch_paused",
        "queue_open",
        "public_dashboard",
        "borrow_keep_idle_gpus",
        "borrow_max_seconds",
        "max_wait_by_band",
        "priority_by_path",
        "running_long_min_seconds",
    )

    aging_divisor = models.FloatField(default=60.0, help_text="Seconds of waiting per point.")
    swap_affinity_bonus = models.FloatField(default=10.0)
    band_spacing = models.IntegerField(default=100)
    max_attempts = models.PositiveIntegerField(
        default=3, help_text="Dispatches lost to a dead dispatcher before a job fails."
    )
    lease_seconds = models.FloatField(
        default=15.0, help_text="How long a dispatcher may go silent before its job is re-queued."
    )
    dispatch_paused = models.BooleanField(
        default=False, help_text="Hold every queued job (maintenance); running jobs finish."
    )
    queue_open = models.BooleanField(
        default=True,
        help_text="Accept new jobs. Closed (maintenance): submissions get 503; queued jobs stay.",
    )
    public_dashboard = models.BooleanField(
        default=False,
        help_text="Let anyone watch the live queue (read-only, without names or prompts).",
    )
    # The borrowing guard (queueapp/policy/decide.py, Borrowing): a member at
    # its tier's running limit may take a GPU that no other job can use.
    borrow_keep_idle_gpus = models.PositiveIntegerField(
        default=0,
        help_text="Lend a GPU past a member's running limit only while this many other "
        "GPUs stay idle for another member's next job (0: lend whenever a GPU would "
        "otherwise stand idle).",
    )
    borrow_max_seconds = models.FloatField(
        null=True,
        blank=True,
        validators=[MinValueValidator(0)],
        help_text="Lend a GPU past a member's running limit only for jobs whose model is "
        "expected to run under this many seconds (empty: any job).",
    )
    shortest_first_weight = models.FloatField(
        default=0.0,
        db_default=0.0,
        validators=[MinValueValidator(0)],
        help_text="Shorter jobs first inside a band: the most points a job expected to be "
        "short gets, W / (1 + expected seconds / shortest_first_scale); 0: off. With the tier "
        "and swap affinity bonuses it must stay under the band spacing.",
    )
    shortest_first_scale = models.FloatField(
        default=60.0,
        db_default=60.0,
        validators=[MinValueValidator(0.001)],
        help_text="The expected seconds at which a job gets half the shortest-first weight.",
    )
    max_wait_by_band = models.JSONField(
        default=dict,
        blank=True,
        help_text="Default wait bound per band, in seconds, for jobs sent without "
        'X-Gpusched-Max-Wait, e.g. {"100": 30, "-100": 3600} (aliases allowed as keys); '
        "a job that cannot start within it is refused, one that waits past it expires. "
        "Empty: no default bound.",
    )
    priority_by_path = models.JSONField(
        default=default_priority_by_path,
        blank=True,
        help_text="The band of a call that names none (no X-LlamaSwap-Priority header, no "
        '"priority" in its body), by path, e.g. {"/v1/audio/speech": "interactive"} '
        "(an alias is stored as its band); a path not listed: normal (0).",
    )

    running_long_min_seconds = models.FloatField(
        default=RUNNING_LONG_MIN_SECONDS,
        validators=[MinValueValidator(0)],
        help_text="The holder watchdog reports a running job (one WARNING line, "
        f'"running long" on the dashboard) once it has held its GPU for '
        f"{RUNNING_LONG_FACTOR:g} x its estimate, and never before this many seconds.",
    )

    class Meta:
        verbose_name_plural = "policy"

    def __str__(self) -> str:
        return "scheduling policy"
