"""A front-door call's admission: its job queued and, when the GPU is idle
and the score picks it, granted in the same commit (no hop through the
dispatcher). The claim itself is the dispatcher's (queueapp/dispatch/claim.py).
"""

from __future__ import annotations

from typing import Any

from django.db import transaction

from queueapp.dispatch.claim import gateway_claim
from queueapp.dispatch.outcomes import ClaimedJob, claimed
from queueapp.models import Job
from queueapp.prepared import commit_without_flush_wait
from queueapp.services.jobs import job_queue


@transaction.atomic(durable=True)
def job_submit_and_claim(
    *, gateway: int, worker: str, claim: bool = True, **submission: Any
) -> tuple[Job, ClaimedJob | None]:
    """A front-door call's job queued (`services.job_queue`, `submission` its
    arguments) and, in the same transaction and commit, `gateway_claim`:
    granted at once when the GPU is idle and the score picks it. `claim`
    False: the caller knows the GPU is busy; only the job is queued."""
    commit_without_flush_wait()  # the caller, waiting on its connection, is the durable party
    job = job_queue(gateway=gateway, front_door=True, **submission)
    if not claim:
        return job, None
    return job, claimed(gateway_claim(gateway=gateway, worker=worker, model=job.model))
