"""Tables of the GPU queue. Behaviour lives in services and selectors."""

from __future__ import annotations

import base64
import hashlib
import secrets
from collections.abc import Sequence

from django.contrib.postgres.fields import ArrayField
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q
from django.db.models.functions import Now

from queueapp.job_body import (
    MAX_CALLBACK_URL,
    MAX_CHAIN_ID,
    MAX_GPU_NAME,
    MAX_JOB_PATH,
    MAX_MODEL_NAME,
)
from queueapp.policy.occupancy import MAX_PARALLEL
from queueapp.policy.placement import Reservation
from queueapp.policy.priority import default_priority_by_path
from queueapp.policy.running_long import RUNNING_LONG_FACTOR, RUNNING_LONG_MIN_SECONDS


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


class JobStatus(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    # Its wait bound passed before it started: it never reached llama-swap.
    EXPIRED = "expired"


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


class ModelSetting(models.Model):
    """What the operator sets for one model (by the name jobs give it).

    `parallel`: how many of its jobs a GPU with it loaded runs at once (a
    batching server: llama.cpp's `--parallel N`, vLLM). 1, the default and
    the rule for a model without a row, is one job at a time.

    `on_caller_gone`: what a front-door caller's hang-up does to its running
    request (`OnCallerGone`); blank, the default and the rule for a model
    without a row, follows the path (`OnCallerGone.by_path`).
    """

    name = models.CharField(max_length=MAX_MODEL_NAME, unique=True)
    parallel = models.PositiveSmallIntegerField(
        default=1,
        validators=[MinValueValidator(1), MaxValueValidator(MAX_PARALLEL)],
        help_text="Jobs of this model one GPU runs at once while it is loaded; set it to "
        "what the server answers at once (llama.cpp's --parallel). 1: one at a time.",
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
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        verbose_name = "model"

    def __str__(self) -> str:
        return self.name


class Gpu(models.Model):
    """One GPU: one llama-swap upstream, driven by a dispatcher of its own.

    Registered by its dispatcher (and by `make run`); the dispatcher keeps
    what it last saw of llama-swap current here. The web servers read the
    URL to make a front-door call on it, so it must be reachable from them.
    """

    name = models.CharField(max_length=MAX_GPU_NAME, unique=True)
    url = models.URLField(max_length=500, help_text="Its llama-swap, as the web servers reach it.")
    enabled = models.BooleanField(
        default=True,
        help_text="Disabled: it finishes the job it runs and claims no other.",
    )
    # As llama-swap lists them at GET /v1/models; null until first read.
    served_models = ArrayField(models.CharField(max_length=MAX_MODEL_NAME), null=True, blank=True)
    allowed_models = ArrayField(
        models.CharField(max_length=MAX_MODEL_NAME),
        default=list,
        blank=True,
        help_text="Narrows the models it runs to these (of those llama-swap serves); "
        "empty: every model it serves.",
    )
    # Reservation: when either is set, the GPU takes only jobs of at least
    # `min_band`, or jobs expected to run under `max_expected_seconds`, so
    # interactive work always finds a GPU not stuck in a long render.
    min_band = models.IntegerField(
        null=True,
        blank=True,
        help_text="Reservation: take only jobs of at least this band (or short ones, below).",
    )
    max_expected_seconds = models.FloatField(
        null=True,
        blank=True,
        validators=[MinValueValidator(0)],
        help_text="Reservation: take jobs of a lower band only when expected to run under "
        "this many seconds.",
    )
    reachable = models.BooleanField(default=False)
    resident_model = models.CharField(max_length=MAX_MODEL_NAME, blank=True)
    checked_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True)
    registered_at = models.DateTimeField(db_default=Now())

    class Meta:
        ordering = ["name"]
        verbose_name = "GPU"

    def __str__(self) -> str:
        return self.name

    @property
    def reservation(self) -> Reservation:
        """Its reservation (queueapp/policy/placement.py), unset when neither is."""
        return Reservation(self.min_band, self.max_expected_seconds)

    @property
    def reserved(self) -> bool:
        return self.reservation.reserved

    def runs_models(self, *, alone: bool = False) -> list[str] | None:
        """The models it may be given (served, narrowed by the operator);
        None (any model) when llama-swap's list is not read yet and no
        narrowing is set. `alone`: it is the only enabled GPU, so there is no
        placement to make, and it is given any model but those the operator
        left out, as a single llama-swap is (models llama-swap does not list,
        `unlisted` ones included, are its to answer)."""
        if self.served_models is None or alone:
            return list(self.allowed_models) or None
        if not self.allowed_models:
            return list(self.served_models)
        return [model for model in self.served_models if model in self.allowed_models]

    @staticmethod
    def models_served(enabled: Sequence[Gpu]) -> frozenset[str] | None:
        """Every model some of the `enabled` GPUs runs; None (any model) when
        one GPU alone runs any, or a GPU's list is not read yet."""
        if len(enabled) <= 1:
            return None
        served: set[str] = set()
        for gpu in enabled:
            runs = gpu.runs_models()
            if runs is None:
                return None
            served.update(runs)
        return frozenset(served)


class Job(models.Model):
    member = models.ForeignKey(Member, on_delete=models.CASCADE, related_name="jobs")
    path = models.CharField(max_length=MAX_JOB_PATH)
    body = models.JSONField()
    model = models.CharField(max_length=MAX_MODEL_NAME)
    priority_requested = models.BigIntegerField(default=0)
    priority = models.IntegerField(default=0, help_text="Applied priority: the band.")
    status = models.CharField(max_length=16, choices=JobStatus, default=JobStatus.QUEUED)
    submitted_at = models.DateTimeField()
    # When the job started to age: its submission, or its lane's last
    # dispatch if later (docs/policy.md). Current for lane heads.
    eligible_at = models.DateTimeField()
    # band + tier bonus - age origin / divisor; kept current for lane heads
    # by the services that change any of them; the claim orders by it.
    rank_key = models.FloatField()
    # The first queued job of its line (member, band, model) in submission
    # order. Only heads can be dispatched next, so only heads are in the
    # claim's indexes and only their keys must be current (queueapp/lanes.py).
    is_lane_head = models.BooleanField(default=False)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # The dispatcher that runs the job renews the lease; an expired lease
    # means that dispatcher died.
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    lease_owner = models.CharField(max_length=200, blank=True)
    # Times the job was started; a dispatcher that dies mid-job costs one.
    attempts = models.PositiveIntegerField(default=0)
    # The GPU it runs or ran on (set by the claim); one running job per
    # GPU slot, enforced by the database.
    gpu = models.ForeignKey(
        Gpu, null=True, blank=True, on_delete=models.PROTECT, related_name="jobs"
    )
    gpu_slot = models.PositiveSmallIntegerField(default=0)
    score_at_dispatch = models.JSONField(null=True, blank=True)
    result_status_code = models.IntegerField(null=True, blank=True)
    result_content_type = models.CharField(max_length=200, blank=True)
    result_body = models.JSONField(null=True, blank=True)
    result_file = models.FileField(upload_to="results/", blank=True)
    error = models.TextField(blank=True, default="")
    callback_url = models.URLField(max_length=MAX_CALLBACK_URL, blank=True)
    # Submitted through the OpenAI-compatible front door: the caller's own
    # connection makes the upstream call once the dispatcher grants it the GPU.
    front_door = models.BooleanField(default=False)
    # The web process (front-door gateway, queueapp/frontdoor/gateway.py)
    # whose caller waits for this job; null for REST jobs. The claim grants a
    # front-door job only while that process is alive.
    gateway = models.IntegerField(null=True, blank=True)
    # A front-door caller who hung up while the job ran: when (the database's
    # clock), and how long its GPU was held after that while llama-swap's
    # answer was read to its end (`OnCallerGone.DRAIN`; null when closed).
    caller_left_at = models.DateTimeField(null=True, blank=True)
    drained_seconds = models.FloatField(null=True, blank=True)
    chain_id = models.CharField(max_length=MAX_CHAIN_ID, blank=True)
    chain_index = models.PositiveIntegerField(null=True, blank=True)
    chain_total = models.PositiveIntegerField(null=True, blank=True)
    # The caller's wait bound (X-Gpusched-Max-Wait, or the band's default in
    # the policy): queued past this, the job expires instead of running.
    wait_deadline = models.DateTimeField(null=True, blank=True)
    # When the holder watchdog reported this run as running long (database
    # clock; queueapp/services/running_long.py): at most once per run, so a
    # requeue or a resubmission clears it.
    running_long_at = models.DateTimeField(null=True, blank=True)
    # The GPU (by name: a row deleted and registered again keeps it) that
    # alone may run the job, as a preload may ask; blank: any that serves
    # its model (decide's Skip.PINNED).
    pinned_gpu = models.CharField(
        max_length=MAX_GPU_NAME,
        blank=True,
        default="",
        db_default="",
        help_text="Only this GPU may run it (a preload's `gpu`); blank: any.",
    )

    class Meta:
        ordering = ["-id"]
        indexes = [
            # The claim: best queued job overall ...
            models.Index(
                models.F("rank_key").desc(),
                "id",
                name="job_queued_rank",
                condition=Q(status="queued", is_lane_head=True),
            ),
            # ... and best queued job of the resident model (swap affinity).
            models.Index(
                "model",
                models.F("rank_key").desc(),
                "id",
                name="job_queued_model_rank",
                condition=Q(status="queued", is_lane_head=True),
            ),
            # A queue line's jobs in order: its head and the ones after it.
            models.Index(
                "member",
                "priority",
                "model",
                "submitted_at",
                "id",
                name="job_queued_lane",
                condition=Q(status="queued"),
            ),
            models.Index(fields=["member", "status"], name="job_member_status"),
            # Queued front-door jobs by web process: finding those whose caller's
            # process died is one index scan however long the queue.
            models.Index(
                "gateway",
                name="job_queued_gateway",
                condition=Q(status="queued", front_door=True),
            ),
            models.Index(
                "lease_expires_at", name="job_running_lease", condition=Q(status="running")
            ),
            # The sweep for queued jobs past their wait bound: one index scan.
            models.Index(
                "wait_deadline",
                name="job_queued_wait_deadline",
                condition=Q(status="queued", wait_deadline__isnull=False),
            ),
            # Recent run times (metrics, estimates) without scanning history.
            models.Index(fields=["finished_at"], name="job_finished_at"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["gpu", "gpu_slot"],
                condition=Q(status="running"),
                name="job_one_running_per_gpu",
            ),
        ]

    def __str__(self) -> str:
        return f"job {self.pk} ({self.model}, {self.status})"


class JobEvent(models.Model):
    """Audit trail: one row per state change, written in the same transaction."""

    class Kind(models.TextChoices):
        SUBMITTED = "submitted"
        STARTED = "started"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        CANCELLED = "cancelled"
        # Its wait bound passed while it was queued.
        EXPIRED = "expired"
        # Its dispatcher died and the lease recovery queued it again, or an
        # operator put a finished job back in the queue.
        REQUEUED = "requeued"
        # llama-swap never took the body (unreachable, busy): the claim was undone.
        RETURNED_TO_QUEUE = "returned_to_queue"
        # A tier's new cap or floor moved it to another band.
        RECLAMPED = "reclamped"
        # Its front-door caller hung up while it ran; it ends when its model's
        # `on_caller_gone` says (at once, or once llama-swap has answered).
        CALLER_LEFT = "caller_left"
        # It had held its GPU past the holder watchdog's limit (reported, not stopped).
        RUNNING_LONG = "running_long"

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="events")
    at = models.DateTimeField(db_default=Now())
    kind = models.CharField(max_length=40, choices=Kind)
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["kind"], name="jobevent_kind")]

    def __str__(self) -> str:
        return f"{self.kind} job {self.job_id}"


class Lane(models.Model):
    """A member's jobs in one band: when one of them was last dispatched."""

    member = models.ForeignKey(Member, on_delete=models.CASCADE, related_name="lanes")
    band = models.IntegerField()
    last_dispatched_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["member", "band"], name="lane_member_band"),
        ]

    def __str__(self) -> str:
        return f"{self.member_id}/{self.band}"


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
    swap_needed = models.BooleanField()
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


class Policy(models.Model):
    """The operator's settings; one row (pk=1). Read at every dispatch."""

    # What the operator may change (API, admin); every other column is the row's own.
    EDITABLE_FIELDS = (
        "aging_divisor",
        "swap_affinity_bonus",
        "band_spacing",
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

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["model", "path", "concurrency"], name="runstats_model_path_concurrency"
            ),
        ]
        verbose_name_plural = "run statistics"

    def __str__(self) -> str:
        return f"{self.model} {self.path}"


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
