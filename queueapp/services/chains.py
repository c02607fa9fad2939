"""Chains: long work submitted one unit at a time (reads: queueapp/chain_summaries.py).

A chain's units are ordinary jobs of one member, so a chain's change is a
change to that member's jobs, under its lines lock.
"""

from __future__ import annotations

from django.db import transaction

from queueapp.errors import NotFound
from queueapp.locks import lock_member_lines
from queueapp.models import Job, JobStatus, Member
from queueapp.services.jobs import queued_jobs_cancel


@transaction.atomic(durable=True)
def chain_cancel(*, member: Member, chain_id: str, by: str) -> int:
    """Cancel a chain's queued units; a running unit runs to its end."""
    lock_member_lines(member.pk)
    units = Job.objects.filter(member=member, chain_id=chain_id)
    if not units.exists():
        raise NotFound("chain not found")
    queued = list(units.select_for_update().filter(status=JobStatus.QUEUED))
    queued_jobs_cancel(queued, by=by)
    return len(queued)
