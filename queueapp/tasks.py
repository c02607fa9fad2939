"""django-q2 tasks: thin entry points that call the dispatcher."""

from queueapp.dispatch.loop import run_pass


def dispatch() -> str:
    """One dispatch pass on the GPU worker (see queueapp/dispatch/loop.py)."""
    return run_pass().summary()


def deliver_webhooks() -> str:
    """Send due webhook deliveries (the `webhooks` cluster, never the GPU one)."""
    from queueapp.webhooks.delivery import deliver_due

    return f"attempted {deliver_due()} delivery(ies)"
