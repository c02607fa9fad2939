"""Chains (reads): long work (a film of 174 shots) submitted one unit at a time.

A chain has no priority of its own: each unit is scored like any job. What a
chain adds is a view of the whole: progress, time used and an estimate of
the time left.
"""

from __future__ import annotations

from typing import Any

from django.db.models import Count, Max, Min, Q

from queueapp.durations import Durations
from queueapp.models import Job, JobStatus, Member
from queueapp.selectors import db_now


def chain_summaries(*, member: Member, chain_id: str | None = None) -> list[dict[str, Any]]:
    """Progress of the member's chains, most recently active first."""
    units = Job.objects.filter(member=member).exclude(chain_id="")
    if chain_id is not None:
        units = units.filter(chain_id=chain_id)
    rows = (
        units.values("chain_id")
        .annotate(
            total=Max("chain_total"),
            submitted=Count("id"),
            done=Count("id", filter=Q(status=JobStatus.SUCCEEDED)),
            failed=Count("id", filter=Q(status=JobStatus.FAILED)),
            cancelled=Count("id", filter=Q(status=JobStatus.CANCELLED)),
            expired=Count("id", filter=Q(status=JobStatus.EXPIRED)),
            queued=Count("id", filter=Q(status=JobStatus.QUEUED)),
            running=Count("id", filter=Q(status=JobStatus.RUNNING)),
            first_start=Min("started_at"),
            last_submit=Max("submitted_at"),
        )
        .order_by("-last_submit")
    )
    now = db_now()
    durations = Durations.load()
    summaries = []
    for row in rows:
        chain_jobs = list(
            units.filter(chain_id=row["chain_id"]).values(
                "status", "started_at", "finished_at", "model", "path"
            )
        )
        used = sum(
            ((job["finished_at"] or now) - job["started_at"]).total_seconds()
            for job in chain_jobs
            if job["started_at"] is not None
        )
        finished_runs = [
            (job["finished_at"] - job["started_at"]).total_seconds()
            for job in chain_jobs
            if job["status"] == JobStatus.SUCCEEDED and job["finished_at"] and job["started_at"]
        ]
        latest = chain_jobs[-1]
        per_unit = (
            sum(finished_runs) / len(finished_runs)
            if finished_runs
            else durations.run_seconds(latest["model"], latest["path"])
        )
        left_units = max(0, (row["total"] or 0) - row["done"])
        summaries.append(
            {
                "id": row["chain_id"],
                "total": row["total"],
                "done": row["done"],
                "submitted": row["submitted"],
                "queued": row["queued"],
                "running": row["running"],
                "failed": row["failed"],
                "cancelled": row["cancelled"],
                "expired": row["expired"],
                "started_at": row["first_start"].isoformat() if row["first_start"] else None,
                "time_used_seconds": round(used, 3),
                "estimate": {
                    "seconds_left": round(left_units * per_unit, 1),
                    "seconds_per_unit": round(per_unit, 3),
                    "basis": "mean of this chain's finished units"
                    if finished_runs
                    else "typical run of this model (no unit finished yet)",
                },
            }
        )
    return summaries
