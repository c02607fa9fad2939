"""Tables of the GPU queue. Behaviour lives in services and selectors.

One module per concern; every model is imported here, so `from
queueapp.models import Job` works everywhere and Django finds them all.
`new_webhook_secret` stays importable here: migration 0001 names it
`queueapp.models.new_webhook_secret`.
"""

from queueapp.models.decisions import DispatchDecision, GpuIdle
from queueapp.models.gpus import Gpu
from queueapp.models.jobs import Job, JobEvent, JobStatus, Lane
from queueapp.models.members import Member, Tier, hash_token, new_webhook_secret
from queueapp.models.model_settings import ModelSetting, OnCallerGone
from queueapp.models.policy import Policy
from queueapp.models.run_stats import RunStats
from queueapp.models.webhooks import (
    DisabledCallback,
    WebhookAttempt,
    WebhookDelivery,
    WebhookStatus,
)

__all__ = [
    "DisabledCallback",
    "DispatchDecision",
    "Gpu",
    "GpuIdle",
    "Job",
    "JobEvent",
    "JobStatus",
    "Lane",
    "Member",
    "ModelSetting",
    "OnCallerGone",
    "Policy",
    "RunStats",
    "Tier",
    "WebhookAttempt",
    "WebhookDelivery",
    "WebhookStatus",
    "hash_token",
    "new_webhook_secret",
]
