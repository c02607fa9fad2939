"""Writes. Each state change is one transaction together with its audit row.

Job state changes are durable transactions (never nested in a caller's).
Settings changes that the admin's forms make are plain `atomic`, because
Django's change view already wraps the save in a transaction. Locks are
taken through queueapp/locks.py, in the order written there.

One module per subject: jobs, chains, policy, tiers, members, GPUs, models and
the holder watchdog (running_long). Callers use
the package (`services.job_submit(...)`); the modules are its layout.
"""

from queueapp.services.chains import chain_cancel
from queueapp.services.gpus import (
    gpu_configured,
    gpu_register,
    gpu_routing_record,
    gpu_server_slots_record,
    gpu_settings_update,
    gpu_state_record,
    gpu_update,
    gpus_configured_register,
)
from queueapp.services.jobs import (
    front_door_orphans_cancel,
    job_cancel,
    job_preload,
    job_requeue,
    job_submit,
    jobs_expire_overdue,
)
from queueapp.services.members import (
    member_create,
    member_save,
    member_token_rotate,
    member_webhook_secret_rotate,
    new_api_token,
)
from queueapp.services.models import (
    model_parallel_check,
    model_parallel_set,
    model_parallels_refresh,
    model_served_check,
    model_setting_update,
)
from queueapp.services.policy import POLICY_FIELDS, policy_update, queued_rank_keys_refresh
from queueapp.services.running_long import jobs_report_running_long
from queueapp.services.tiers import tier_check, tier_save

__all__ = [
    "POLICY_FIELDS",
    "chain_cancel",
    "front_door_orphans_cancel",
    "gpu_configured",
    "gpu_register",
    "gpu_routing_record",
    "gpu_settings_update",
    "gpu_server_slots_record",
    "gpu_state_record",
    "gpu_update",
    "gpus_configured_register",
    "job_cancel",
    "job_preload",
    "job_requeue",
    "job_submit",
    "jobs_expire_overdue",
    "jobs_report_running_long",
    "member_create",
    "member_save",
    "member_token_rotate",
    "member_webhook_secret_rotate",
    "model_parallel_check",
    "model_parallel_set",
    "model_parallels_refresh",
    "model_served_check",
    "model_setting_update",
    "new_api_token",
    "policy_update",
    "queued_rank_keys_refresh",
    "tier_check",
    "tier_save",
]
