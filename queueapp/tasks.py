"""django-q2 tasks: thin entry points that call the dispatcher."""

from queueapp.dispatch.loop import run_pass


def dispatch() -> str:
    """One dispatch pass on the GPU worker (see queueapp/dispatch/loop.py)."""
    return run_pass(wait_when_idle=True).summary()


def deliver_webhooks() -> str:
    """Send due webhook deliveries (the `webhooks` cluster, never the GPU one)."""
    from queueapp.webhooks.delivery import deliver_due

    return f"attempted {deliver_due()} delivery(ies)"


def expire_overdue_jobs() -> str:
    """The minute safety net of the wait-bound sweep (the `webhooks` cluster);
    dispatchers and web processes sweep every second or so."""
    from queueapp.services import jobs_expire_overdue

    return f"expired {jobs_expire_overdue()} job(s) past their wait bound"


def report_running_long() -> str:
    """The minute safety net of the holder watchdog (the `webhooks` cluster);
    dispatchers and web processes holding a GPU sweep every few seconds."""
    from queueapp.services import jobs_report_running_long

    return f"reported {len(jobs_report_running_long())} job(s) running long"


def refresh_expectations() -> str:
    """Every minute (the `webhooks` cluster): queued jobs' stored estimates,
    set again where the runs learned meanwhile moved them far."""
    from queueapp.services.expectations import recently_learned_expectations_refresh

    return f"set {recently_learned_expectations_refresh()} queued job(s)' estimates again"


# The webhooks cluster's task timeout is 120 s; a pass stops well before it.
PRUNE_PASS_SECONDS = 60.0


def prune_finished_jobs() -> str:
    """The daily retention pass (the `webhooks` cluster: housekeeping never runs
    on the GPU worker). Continues in a new task when its time runs out."""
    from datetime import timedelta

    from django.conf import settings
    from django_q.tasks import async_task

    from queueapp.dispatch.wakeup import WEBHOOK_CLUSTER
    from queueapp.retention import jobs_prune
    from queueapp.selectors import db_now

    days = settings.GPUSCHED_RETENTION_DAYS
    if days <= 0:
        return "retention off (GPUSCHED_RETENTION_DAYS=0)"
    counts = jobs_prune(
        finished_before=db_now() - timedelta(days=days), max_seconds=PRUNE_PASS_SECONDS
    )
    if not counts.finished:
        async_task(
            "queueapp.tasks.prune_finished_jobs",
            cluster=WEBHOOK_CLUSTER,
            task_name="prune-continued",
        )
    return f"pruned {counts.jobs} finished jobs older than {days:g} days" + (
        "" if counts.finished else "; continuing"
    )
