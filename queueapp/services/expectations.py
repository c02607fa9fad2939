"""Queued jobs' stored expectations, set again when what they rest on moved.

A job's expected run is set at its submission (Durations.expected) and kept
on its row, where the claim's SQL pre-filter, the reservation and the
shortest-first term read it without running the fit per row. The runs
learned afterwards move the model's line; a job submitted before the first
runs (basis `unknown` or `operator`) would otherwise keep a guess for as
long as it waits. So, for each model and path whose runs were learned in
the last minutes (or whose typical run the operator changed), the queued
jobs whose estimate would now differ in basis, or by more than MOVED_FAR
of its median, get the new one, with their shortness and rank key.

Where: the `webhooks` cluster, every minute (`tasks.refresh_expectations`,
migration 0033), not the dispatchers: the work is the same whichever
process does it, once is enough, and a claim never waits behind it. How:
one UPDATE per model and path. What a job of no size gets, and whether a
sized one has a line, is decided here by `Durations.expected` (the policy's
order of bases); the SQL only evaluates the line at each job's size, so a
sweep reads no job row into Python however long the queue.
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

from django.db import connection, transaction

from queueapp.durations import Durations
from queueapp.locks import lock_gpu_claims
from queueapp.models import Job, JobStatus, RunStats
from queueapp.policy.size_fit import MIN_RUN_SECONDS, Z90
from queueapp.selectors import db_now, policy_get
from queueapp.services.policy import shortness_sql
from queueapp.upstream.client import is_preload

# A stored median this far from the new one (as a share of it) is set again.
MOVED_FAR = 0.25
# The runs learned this far back are looked at: the minute between two
# sweeps, and a minute more for a run whose row carries its transaction's
# start though it committed after the last sweep.
LEARNED_WITHIN = timedelta(minutes=2)

_REFRESH_SQL = f"""
    WITH fresh AS (
        SELECT id,
               CASE WHEN size IS NOT NULL AND %(intercept)s::float8 IS NOT NULL
                    THEN 'size' ELSE %(unsized_basis)s END AS basis,
               CASE WHEN size IS NOT NULL AND %(intercept)s::float8 IS NOT NULL
                    THEN greatest(%(min_run)s, exp(%(intercept)s + %(slope)s * ln(size)))
                    ELSE %(unsized_p50)s::float8 END AS p50
          FROM queueapp_job
         WHERE status = 'queued' AND model = %(model)s AND path = %(path)s),
    moved AS (
        SELECT fresh.*,
               CASE WHEN fresh.basis = 'size' THEN fresh.p50 * %(sized_p90)s
                    ELSE %(unsized_p90)s::float8 END AS p90,
               {shortness_sql("fresh.p50")} AS shortness
          FROM fresh JOIN queueapp_job AS job ON job.id = fresh.id
         WHERE fresh.basis <> job.expected_basis
            OR abs(fresh.p50 - job.expected_p50) > %(far)s * job.expected_p50)
    UPDATE queueapp_job AS job
       SET expected_basis = moved.basis, expected_p50 = moved.p50, expected_p90 = moved.p90,
           rank_key = job.rank_key - job.shortness + moved.shortness,
           shortness = moved.shortness
      FROM moved
     WHERE job.id = moved.id
"""


def recently_learned_expectations_refresh() -> int:
    """The models and paths whose runs were learned within LEARNED_WITHIN:
    their queued jobs' expectations, where they moved far."""
    learned = RunStats.objects.filter(
        concurrency=1, updated_at__gte=db_now() - LEARNED_WITHIN
    ).values_list("model", "path")
    pairs = set(learned)
    return queued_expectations_refresh(pairs) if pairs else 0


@transaction.atomic  # also inside the admin's transaction (a typical run changed)
def queued_expectations_refresh(pairs: set[tuple[str, str]]) -> int:
    """Set again the stored expectation of the queued jobs of these models
    and paths that moved far (see the module); how many were."""
    durations = Durations.load()
    policy = policy_get()
    lock_gpu_claims()  # rank keys change: no claim reads them meanwhile
    changed = 0
    with connection.cursor() as cursor:
        for model, path in sorted(pairs):
            if is_preload(path):
                continue
            cursor.execute(
                _REFRESH_SQL,
                _params(durations, model, path)
                | {
                    "weight": policy.shortest_first_weight,
                    "scale": policy.shortest_first_scale,
                    "far": MOVED_FAR,
                },
            )
            changed += cursor.rowcount
    return changed


def model_expectations_refresh(model: str) -> int:
    """After the operator changed `model`'s typical run: its queued jobs."""
    paths = Job.objects.filter(status=JobStatus.QUEUED, model=model).values_list("path")
    return queued_expectations_refresh({(model, path) for (path,) in paths.distinct()})


def _params(durations: Durations, model: str, path: str) -> dict[str, Any]:
    """The model and path's line, and what `Durations.expected` gives a job
    of no size there (the basis a sized job has too while there is no line)."""
    line = durations.lines.get((model, path))
    unsized = durations.expected(model, path, None)
    return {
        "model": model,
        "path": path,
        "intercept": None if line is None else line.intercept,
        "slope": None if line is None else line.slope,
        "sized_p90": 1.0 if line is None else math.exp(Z90 * line.spread),
        "unsized_basis": unsized.basis.value,
        "unsized_p50": unsized.p50,
        "unsized_p90": unsized.p90,
        "min_run": MIN_RUN_SECONDS,
    }
