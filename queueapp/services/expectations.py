"""Queued jobs' stored expectations, set again when what they rest on moved.

A job's expected run is set at its submission (Durations.expected) and kept
on its row, where the claim's SQL pre-filter, the reservation and the
shortest-first term read it without running the fit per row. The runs
learned afterwards move the model's line; a job submitted before the first
runs (basis `unknown` or `operator`) would otherwise keep a guess for as
long as it waits. So, for each model and path whose runs were learned since
the last sweep (or whose typical run the operator changed), the queued jobs
whose estimate would now differ in basis, or by more than MOVED_FAR of its
median, get the new one, with their shortness and rank key: one UPDATE per
model and path, evaluated in SQL from the line's coefficients (the line
itself is fitted once, in Python: queueapp/policy/size_fit.py), so a sweep
reads no job row into Python however long the queue.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from typing import Any

from django.db import connection, transaction

from queueapp.durations import Durations
from queueapp.locks import lock_gpu_claims
from queueapp.models import Job, JobStatus, RunStats
from queueapp.policy.expected import Basis
from queueapp.policy.size_fit import MIN_RUN_SECONDS, UNSIZED_SPREAD, Z90
from queueapp.selectors import db_now, policy_get
from queueapp.upstream.client import is_preload

# A stored median this far from the new one (as a share of it) is set again.
MOVED_FAR = 0.25
# How often a dispatcher looks for models whose runs were learned meanwhile.
EXPECTATIONS_REFRESH_SECONDS = 10.0
# A run's row carries its transaction's start, which may precede the last
# sweep's though it committed after it: the sweep looks back this much more.
LOOKBACK = timedelta(seconds=60)

_REFRESH_SQL = """
    WITH fresh AS (
        SELECT id,
               CASE WHEN size IS NOT NULL AND %(intercept)s::float8 IS NOT NULL THEN 'size'
                    WHEN %(mean)s::float8 IS NOT NULL THEN 'model'
                    WHEN %(typical)s::float8 IS NOT NULL THEN 'operator'
                    ELSE 'unknown' END AS basis,
               CASE WHEN size IS NOT NULL AND %(intercept)s::float8 IS NOT NULL
                    THEN greatest(%(min_run)s, exp(%(intercept)s + %(slope)s * ln(size)))
                    ELSE coalesce(%(mean)s::float8, %(typical)s::float8) END AS p50
          FROM queueapp_job
         WHERE status = 'queued' AND model = %(model)s AND path = %(path)s),
    moved AS (
        SELECT fresh.*,
               CASE WHEN fresh.basis = 'size' THEN %(sized_p90)s ELSE %(unsized_p90)s END
                   * fresh.p50 AS p90,
               CASE WHEN %(weight)s > 0 AND fresh.p50 IS NOT NULL
                    THEN %(weight)s / (1 + greatest(fresh.p50, 0) / %(scale)s) ELSE 0 END
                   AS shortness
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


class ExpectationsRefresh:
    """The sweep of one dispatcher thread: the models and paths learned
    since its last run (all of those with queued jobs, the first time)."""

    def __init__(self) -> None:
        self.last: datetime | None = None

    def __call__(self) -> int:
        started = db_now()
        learned = RunStats.objects.filter(concurrency=1)
        if self.last is not None:
            learned = learned.filter(updated_at__gte=self.last - LOOKBACK)
        pairs = set(learned.values_list("model", "path"))
        if self.last is None:
            queued = Job.objects.filter(status=JobStatus.QUEUED)
            pairs |= set(queued.values_list("model", "path").distinct())
        self.last = started
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
    """The model and path's figures as `Durations.expected` would use them."""
    line = durations.lines.get((model, path))
    unsized = durations.expected(model, path, None)
    return {
        "model": model,
        "path": path,
        "intercept": None if line is None else line.intercept,
        "slope": None if line is None else line.slope,
        "sized_p90": 1.0 if line is None else math.exp(Z90 * line.spread),
        "unsized_p90": math.exp(Z90 * UNSIZED_SPREAD),
        "mean": unsized.p50 if unsized.basis is Basis.MODEL else None,
        "typical": unsized.p50 if unsized.basis is Basis.OPERATOR else None,
        "min_run": MIN_RUN_SECONDS,
    }
