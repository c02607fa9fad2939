"""The jobs, their audit trail, and the lane clocks their aging starts from."""

from __future__ import annotations

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
from queueapp.models.gpus import Gpu
from queueapp.models.members import Member
from queueapp.policy.expected import Basis

# How `why` names a job's size, at most ("362 frames, 30 steps, 1280×720").
MAX_SIZE_TEXT = 120
EXPECTED_BASES = [(basis.value, basis.value) for basis in Basis]


class JobStatus(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    # Its wait bound passed before it started: it never reached llama-swap.
    EXPIRED = "expired"


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
    # What llama-swap's routing was predicted to load and unload for its
    # last start ({"loads": model or null, "unloads": [...]}); null: nothing.
    swap = models.JSONField(null=True, blank=True)
    # Its size, read from its body at submission (queueapp/policy/request_size.py):
    # the number its model and path's learned line uses, and how `why` names it.
    size = models.FloatField(null=True, blank=True)
    size_text = models.CharField(max_length=MAX_SIZE_TEXT, blank=True, default="", db_default="")
    # Its expected run seconds and what they rest on (queueapp/policy/expected.py),
    # set at submission: the claim and the forecast read them from the row.
    expected_p50 = models.FloatField(null=True, blank=True)
    expected_p90 = models.FloatField(null=True, blank=True)
    expected_basis = models.CharField(
        max_length=8, choices=EXPECTED_BASES, default="unknown", db_default="unknown"
    )
    # Its shortest-first term (policy/score.py `shortness`) from expected_p50,
    # part of its rank key; set again when the policy's weight or scale changes.
    shortness = models.FloatField(default=0.0, db_default=0.0)
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
