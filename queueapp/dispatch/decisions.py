"""The dispatcher's audit: why each job went next, and what became of it.

A dispatch writes its `DispatchDecision` (the winner's terms, the runners-up,
who would have won without each term) and the job's `started` event in one
statement, inside the claim's transaction: a job is never running without
the record of why. Every later change the dispatcher makes to the job
(finished, failed, returned, re-queued) writes its `JobEvent` in the
transaction of that change. The log lines are written on commit, so a
rolled-back claim leaves no trace in them.

The record's statement also moves the lane and selects the dashboard's
notice (`queue_notice`): one round trip. The lane's move cannot join the
UPDATE that starts the job: a statement sees one snapshot, and the lane's
next head must be read after the winner stopped being queued.

The counterfactual winners are computed once, here, over the pool the
claim read, and stored with one boolean per term (`changed_by_*`), so the
per-band figures (`/api/stats/`, `/metrics`) are a GROUP BY, not a replay.
A counterfactual winner outside that pool is not seen.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from typing import Any, Protocol

from django.db import transaction
from psycopg.types.json import Jsonb

from queueapp.live.events import queue_notice
from queueapp.models import Gpu, JobEvent, JobStatus
from queueapp.policy import (
    TERMS,
    Candidate,
    PolicySettings,
    RankedCandidate,
    counterfactual_winners,
)
from queueapp.policy.resident_sets import Swap
from queueapp.policy.score import Loaded, is_loaded
from queueapp.prepared import prepared_cursor

# One JSON line per dispatch decision, for an operator to grep a day.
decision_log = logging.getLogger("gpusched.decisions")
# One human line per dispatch and per finish, for the terminal of `make run`.
activity_log = logging.getLogger("gpusched.activity")

# How many leading candidates the decision records: enough to show the
# runners-up, never the whole queue.
LEADING_CANDIDATES = 5


# The decision's row, the lane's move and the job's `started` event in one
# statement. `changed_by_<term>` columns follow policy.TERMS (a renamed term
# fails tests/dispatch/test_decision_log.py, not a claim).
_CHANGED_COLUMNS = ", ".join(f"changed_by_{term}" for term in TERMS)
_CHANGED_VALUES = ", ".join(f"%(changed_by_{term})s" for term in TERMS)
_DECISION_SQL = f"""
    WITH {{lane_ctes}},
    idle AS (
        -- The GPU's idle record ends with its idle stretch: kept with this start.
        DELETE FROM queueapp_gpuidle WHERE gpu_id = %(gpu)s RETURNING since, at, skips),
    decision AS (
        INSERT INTO queueapp_dispatchdecision
            (at, job_id, gpu_id, band, terms, candidates, resident_model, resident_models,
             swap_needed, swap, policy, counterfactuals, {_CHANGED_COLUMNS}, idle_seconds, gpu_slot,
             in_flight, borrowed, skips, idle_reason)
        VALUES (%(now)s, %(job)s, %(gpu)s, %(band)s, %(terms)s, %(candidates)s,
                %(resident)s, %(resident_models)s, %(swap_needed)s, %(swap)s, %(policy)s,
                %(counterfactuals)s,
                {_CHANGED_VALUES},
                %(idle)s, %(slot)s, %(in_flight)s, %(borrowed)s, %(skips)s,
                (SELECT jsonb_build_object('since', since, 'at', at, 'skips', skips)
                   FROM idle))),
    event AS (
        INSERT INTO queueapp_jobevent (job_id, at, kind, detail)
        VALUES (%(job)s, %(now)s, %(started)s, %(event)s))
    SELECT {{notice_sql}}
"""


@dataclass(frozen=True)
class _Dispatch:
    """One dispatch as its record needs it: the claim's facts and what the
    counterfactuals say of them (each derived once: the statement and the
    log lines read them)."""

    gpu: Gpu
    at: datetime
    ranked: list[RankedCandidate]
    resident_model: str | None
    loaded: Loaded  # what swap affinity was scored for (decide.GpuSnapshot.loaded)
    settings: PolicySettings
    attempt: int
    worker: str
    path: str
    gpu_slot: int
    in_flight: int
    borrowed: bool  # lent past its member's running limit (decide.Borrowing)
    swap: Swap | None  # what llama-swap's routing loads and unloads for it
    skips: dict[str, Any]  # why the other heads did not start (policy/skip_record.py)
    without: dict[str, int]  # term -> who would have won without it
    idle: float | None  # seconds the GPU stood idle before it

    @cached_property
    def chosen(self) -> Candidate:
        return self.ranked[0].candidate

    @cached_property
    def terms(self) -> dict[str, float]:
        return self.ranked[0].terms.as_dict()

    @cached_property
    def swap_needed(self) -> bool:
        return not is_loaded(self.chosen.model, self.loaded)

    @cached_property
    def changed(self) -> dict[str, bool]:
        return {term: winner != self.chosen.job_id for term, winner in self.without.items()}

    def params(self) -> dict[str, Any]:
        """The statement's values. Jsonb wraps what psycopg sends as jsonb;
        django-stubs knows only plain values."""
        settings, changed = self.settings, self.changed
        leading = [
            {"job_id": r.candidate.job_id, "model": r.candidate.model} | r.terms.as_dict()
            for r in self.ranked[:LEADING_CANDIDATES]
        ]
        shared = {"slot": self.gpu_slot, "in_flight": self.in_flight} if self.in_flight > 1 else {}
        return {
            "now": self.at,
            "job": self.chosen.job_id,
            "gpu": self.gpu.pk,
            "terms": Jsonb(self.terms),
            "candidates": Jsonb(leading),
            "resident": self.resident_model or "",
            "resident_models": sorted(self.loaded) if isinstance(self.loaded, frozenset) else [],
            "swap_needed": self.swap_needed,
            "swap": None if self.swap is None else Jsonb(self.swap.as_json()),
            "policy": Jsonb(
                {
                    "aging_divisor": settings.aging_divisor,
                    "swap_affinity_bonus": settings.swap_affinity_bonus,
                    "band_spacing": settings.band_spacing,
                }
                | (
                    {
                        "shortest_first_weight": settings.shortest_first_weight,
                        "shortest_first_scale": settings.shortest_first_scale,
                    }
                    if settings.shortest_first_weight
                    else {}
                )
            ),
            "started": JobEvent.Kind.STARTED.value,
            "event": Jsonb(
                {"attempt": self.attempt, "worker": self.worker, "gpu": self.gpu.name} | shared
            ),
            "band": self.chosen.band,
            "counterfactuals": Jsonb(
                {
                    term: {"winner": winner, "changed": changed[term]}
                    for term, winner in self.without.items()
                }
            ),
            "idle": self.idle,
            "slot": self.gpu_slot,
            "in_flight": self.in_flight,
            "borrowed": self.borrowed,
            "skips": Jsonb(self.skips),
            **{f"changed_by_{term}": changed[term] for term in TERMS},
        }

    def log_on_commit(self) -> None:
        """The terminal's line and the decision log's JSON line, once committed."""
        chosen, terms, gpu = self.chosen, self.terms, self.gpu
        shared = f" slot {self.gpu_slot} ({self.in_flight} in flight)" if self.in_flight > 1 else ""
        line = {
            "event": "dispatch",
            "at": self.at.isoformat(),
            "job": chosen.job_id,
            "gpu": gpu.name,
            "band": chosen.band,
            "model": chosen.model,
            "resident_model": self.resident_model,
            "swap_needed": self.swap_needed,
            "swap": None if self.swap is None else self.swap.as_json(),
            "terms": terms,
            "runners_up": [r.candidate.job_id for r in self.ranked[1:LEADING_CANDIDATES]],
            "changed_by": sorted(term for term, flag in self.changed.items() if flag),
            "idle_seconds": self.idle,
            "slot": self.gpu_slot,
            "in_flight": self.in_flight,
            "borrowed": self.borrowed,
        }
        transaction.on_commit(
            lambda: activity_log.info(
                "job %s started on %s%s: %s %s, band %s, score %.1f%s%s",
                chosen.job_id,
                gpu.name,
                shared,
                self.path,
                chosen.model,
                chosen.band,
                terms["effective"],
                self._swap_words(),
                " (borrowed past the member's running limit)" if self.borrowed else "",
            )
        )
        transaction.on_commit(lambda: decision_log.info(json.dumps(line)))

    def _swap_words(self) -> str:
        """ " (loading image-xl unloads tts-kokoro)" for the terminal's line."""
        if self.swap is not None and (self.swap.unloads or self.swap.loads):
            return f" ({self.swap.sentence()})"
        return " (model swap)" if self.swap_needed else ""


def decision_record(
    *,
    gpu: Gpu,
    at: datetime,
    ranked: list[RankedCandidate],
    candidates: list[Candidate],
    resident_model: str | None,
    settings: PolicySettings,
    previous_finished_at: datetime | None,
    loaded: Loaded = None,
    attempt: int,
    worker: str,
    path: str,
    lane_move: tuple[str, dict[str, Any]],
    gpu_slot: int = 0,
    in_flight: int = 1,
    borrowed: bool = False,
    swap: Swap | None = None,
    skips: dict[str, Any] | None = None,
) -> None:
    """The decision that started `ranked[0]` on `gpu`, and the job's `started` event.

    `candidates`: every head that was ranked, for the counterfactuals (who
    would have won without each term). `previous_finished_at`: when the GPU
    last freed, for the idle gap before this dispatch. `lane_move`: the
    lane's move (`lanes.lane_dispatched_sql`), data-modifying CTEs and their
    parameters, written by the same statement. `gpu_slot`, `in_flight`:
    the slot the job takes and the jobs on the GPU with it (itself
    included), for a model whose jobs share the GPU. `borrowed`: the GPU
    was lent past the member's running limit. `swap`: what llama-swap's
    routing is predicted to load and unload for it. `skips`: why the other heads
    did not start (policy/skip_record.py); the GPU's idle record, if any,
    moves into the row with it.
    """
    idle = max(0.0, (at - previous_finished_at).total_seconds()) if previous_finished_at else None
    dispatch = _Dispatch(
        gpu=gpu,
        at=at,
        ranked=ranked,
        resident_model=resident_model,
        loaded=resident_model if loaded is None else loaded,
        settings=settings,
        attempt=attempt,
        worker=worker,
        path=path,
        gpu_slot=gpu_slot,
        in_flight=in_flight,
        borrowed=borrowed,
        swap=swap,
        skips=skips or {},
        without=counterfactual_winners(
            candidates,
            now=at.timestamp(),
            resident_model=resident_model if loaded is None else loaded,
            settings=settings,
        ),
        idle=0.0 if in_flight > 1 else idle,  # sharing: the GPU was busy with its jobs
    )
    notice = queue_notice(kind=JobEvent.Kind.STARTED, job_id=dispatch.chosen.job_id)
    lane_ctes, lane_params = lane_move
    with prepared_cursor() as cursor:
        cursor.execute(
            _DECISION_SQL.format(lane_ctes=lane_ctes, notice_sql=notice.sql),
            dispatch.params() | notice.params | lane_params,
        )
    dispatch.log_on_commit()


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


# Committed without waiting for the WAL flush (a pass that started nothing
# was an empty commit before): a crash loses at most the record of the last
# pass, which the next pass writes again.
_IDLE_SQL = """
    INSERT INTO queueapp_gpuidle AS idle (gpu_id, since, at, skips)
    SELECT %(gpu)s, %(now)s, %(now)s, %(skips)s
      FROM (SELECT set_config('synchronous_commit', 'off', true)) AS no_flush_wait
    ON CONFLICT (gpu_id) DO UPDATE
       SET at = excluded.at, skips = excluded.skips,
           -- The same members held at their limit: the stretch goes on.
           since = CASE WHEN idle.skips -> 'capped_members' = excluded.skips -> 'capped_members'
                        THEN idle.since ELSE excluded.since END
"""


def gpu_idle_record(*, gpu_id: int, at: datetime, skips: dict[str, Any]) -> None:
    """Why GPU `gpu_id` stands idle after a pass that started nothing: its
    one record, `since` the first pass that found the same members held at
    their running limit (what `why` reads of it)."""
    params: dict[str, Any] = {"gpu": gpu_id, "now": at, "skips": Jsonb(skips)}  # Jsonb: see params
    with prepared_cursor() as cursor:
        cursor.execute(_IDLE_SQL, params)
