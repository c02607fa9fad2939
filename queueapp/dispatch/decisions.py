"""The dispatcher's audit: why each job went next, and what became of it.

A dispatch writes its `DispatchDecision` (the winner's terms, the runners-up,
who would have won without each term) and the job's `started` event in one
statement, inside the claim's transaction: a job is never running without
the record of why. Every later change the dispatcher makes to the job
(finished, failed, returned, re-queued) writes its `JobEvent` in the
transaction of that change. The log lines are written on commit, so a
rolled-back claim leaves no trace in them.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime
from typing import Any, Protocol

from django.db import transaction
from psycopg.types.json import Jsonb

from queueapp.live.events import queue_notice
from queueapp.models import Gpu, JobEvent, JobStatus
from queueapp.policy import Candidate, PolicySettings, RankedCandidate, counterfactual_winners
from queueapp.prepared import prepared_cursor

# One JSON line per dispatch decision, for an operator to grep a day.
decision_log = logging.getLogger("gpusched.decisions")
# One human line per dispatch and per finish, for the terminal of `make run`.
activity_log = logging.getLogger("gpusched.activity")

# How many leading candidates the decision records: enough to show the
# runners-up, never the whole queue.
LEADING_CANDIDATES = 5


def decision_record(
    *,
    gpu: Gpu,
    at: datetime,
    ranked: list[RankedCandidate],
    candidates: list[Candidate],
    resident_model: str | None,
    settings: PolicySettings,
    previous_finished_at: datetime | None,
    attempt: int,
    worker: str,
    path: str,
    lane_move: tuple[str, dict[str, Any]],
    gpu_slot: int = 0,
    in_flight: int = 1,
) -> None:
    """The decision that started `ranked[0]` on `gpu`, and the job's `started` event.

    `candidates`: every head that was ranked, for the counterfactuals (who
    would have won without each term). `previous_finished_at`: when the GPU
    last freed, for the idle gap before this dispatch. `lane_move`: the
    lane's move (`lanes.lane_dispatched_sql`), data-modifying CTEs and their
    parameters, written by the same statement. `gpu_slot`, `in_flight`:
    the slot the job takes and the jobs on the GPU with it (itself
    included), for a model whose jobs share the GPU.
    """
    chosen = ranked[0].candidate
    terms = ranked[0].terms.as_dict()
    swap_needed = chosen.model != resident_model
    without = counterfactual_winners(
        candidates, now=at.timestamp(), resident_model=resident_model, settings=settings
    )
    changed = {term: winner != chosen.job_id for term, winner in without.items()}
    idle = max(0.0, (at - previous_finished_at).total_seconds()) if previous_finished_at else None
    if in_flight > 1:
        idle = 0.0  # the GPU was busy with the jobs it shares
    # Jsonb wraps what psycopg sends as jsonb; django-stubs knows only plain values.
    params: dict[str, Any] = {
        "now": at,
        "job": chosen.job_id,
        "gpu": gpu.pk,
        "terms": Jsonb(terms),
        "candidates": Jsonb(
            [
                {"job_id": r.candidate.job_id, "model": r.candidate.model} | r.terms.as_dict()
                for r in ranked[:LEADING_CANDIDATES]
            ]
        ),
        "resident": resident_model or "",
        "swap": swap_needed,
        "policy": Jsonb(
            {
                "aging_divisor": settings.aging_divisor,
                "swap_affinity_bonus": settings.swap_affinity_bonus,
                "band_spacing": settings.band_spacing,
            }
        ),
        "started": JobEvent.Kind.STARTED.value,
        "event": Jsonb(
            {"attempt": attempt, "worker": worker, "gpu": gpu.name}
            | ({"slot": gpu_slot, "in_flight": in_flight} if in_flight > 1 else {})
        ),
        "band": chosen.band,
        "counterfactuals": Jsonb(
            {term: {"winner": without[term], "changed": changed[term]} for term in without}
        ),
        "idle": idle,
        "slot": gpu_slot,
        "in_flight": in_flight,
        **changed,
    }
    notice = queue_notice(kind=JobEvent.Kind.STARTED, job_id=chosen.job_id)
    params.update(notice.params)
    lane_ctes, lane_params = lane_move
    params.update(lane_params)
    with prepared_cursor() as cursor:
        cursor.execute(
            f"""
            WITH {lane_ctes},
            decision AS (
                INSERT INTO queueapp_dispatchdecision
                    (at, job_id, gpu_id, band, terms, candidates, resident_model, swap_needed,
                     policy, counterfactuals, changed_by_aging, changed_by_swap_affinity,
                     changed_by_tier_bonus, changed_by_fairness, idle_seconds, gpu_slot,
                     in_flight)
                VALUES (%(now)s, %(job)s, %(gpu)s, %(band)s, %(terms)s, %(candidates)s,
                        %(resident)s, %(swap)s, %(policy)s, %(counterfactuals)s,
                        %(aging)s, %(swap_affinity)s, %(tier_bonus)s, %(fairness)s,
                        %(idle)s, %(slot)s, %(in_flight)s)),
            event AS (
                INSERT INTO queueapp_jobevent (job_id, at, kind, detail)
                VALUES (%(job)s, %(now)s, %(started)s, %(event)s))
            SELECT {notice.sql}
            """,
            params,
        )
    transaction.on_commit(
        lambda: activity_log.info(
            "job %s started on %s%s: %s %s, band %s, score %.1f%s",
            chosen.job_id,
            gpu.name,
            f" slot {gpu_slot} ({in_flight} in flight)" if in_flight > 1 else "",
            path,
            chosen.model,
            chosen.band,
            terms["effective"],
            " (model swap)" if swap_needed else "",
        )
    )
    transaction.on_commit(
        lambda: decision_log.info(
            json.dumps(
                {
                    "event": "dispatch",
                    "at": at.isoformat(),
                    "job": chosen.job_id,
                    "gpu": gpu.name,
                    "band": chosen.band,
                    "model": chosen.model,
                    "resident_model": resident_model,
                    "swap_needed": swap_needed,
                    "terms": terms,
                    "runners_up": [r.candidate.job_id for r in ranked[1:LEADING_CANDIDATES]],
                    "changed_by": sorted(term for term, flag in changed.items() if flag),
                    "idle_seconds": idle,
                    "slot": gpu_slot,
                    "in_flight": in_flight,
                }
            )
        )
    )


class _Ended(Protocol):
    """A job as its end is logged: a model instance, or the end's own row."""

    @property
    def pk(self) -> Any: ...
    @property
    def status(self) -> str: ...
    @property
    def error(self) -> str: ...
    @property
    def started_at(self) -> datetime | None: ...
    @property
    def finished_at(self) -> datetime | None: ...


def job_end_log(job: _Ended) -> None:
    """The finished job's line in the terminal, once its transaction commits."""
    seconds = (
        (job.finished_at - job.started_at).total_seconds()
        if job.started_at and job.finished_at
        else 0.0
    )
    outcome = job.status if job.status == JobStatus.SUCCEEDED else f"{job.status}: {job.error}"
    transaction.on_commit(
        lambda: activity_log.info("job %s %s after %.2f s", job.pk, outcome, seconds)
    )
