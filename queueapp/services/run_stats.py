"""What finished jobs took, learned: the decayed averages that the
estimates read (queueapp/durations.py), and the sums of the line that gives
a sized run's seconds (queueapp/policy/size_fit.py), written in the
transaction that ends a job."""

from __future__ import annotations

import math

from queueapp.policy.expected import NEWEST_RUN_WEIGHT
from queueapp.policy.size_fit import FIT_DECAY, MIN_RUN_SECONDS
from queueapp.prepared import prepared_cursor

# The run's seconds without its swap, in logarithms: a run that swapped
# less the swap its model and path have shown (its decayed cold less warm).
_LOG_RUN = """ln(greatest(%(seconds)s - CASE WHEN %(swapped)s
    THEN greatest(0, queueapp_runstats.cold_seconds - queueapp_runstats.warm_seconds)
    ELSE 0 END, %(min_run)s))"""
# A sized run alone folds into the line: one that swapped only once the
# swap is known (both averages learned), so that it can be taken out.
_FOLDS = """(%(log_size)s::float8 IS NOT NULL AND (NOT %(swapped)s OR
    (queueapp_runstats.cold_seconds IS NOT NULL AND queueapp_runstats.warm_seconds IS NOT NULL)))"""
# Each sum's term for this run (size_fit.SizeFitSums.with_run, in SQL).
_FIT_TERMS = {
    "fit_weight": "1",
    "fit_x": "%(log_size)s",
    "fit_y": _LOG_RUN,
    "fit_xx": "%(log_size)s * %(log_size)s",
    "fit_xy": f"%(log_size)s * {_LOG_RUN}",
    "fit_yy": f"{_LOG_RUN} * {_LOG_RUN}",
}
_FIT_UPDATES = ",\n".join(
    f"{column} = CASE WHEN {_FOLDS} THEN queueapp_runstats.{column} * %(decay)s + {term}"
    f" ELSE queueapp_runstats.{column} END"
    for column, term in _FIT_TERMS.items()
)


def run_stats_record(
    *,
    model: str,
    path: str,
    seconds: float,
    swapped: bool,
    concurrency: int = 1,
    size: float | None = None,
) -> None:
    """Fold one finished run into the decayed averages of its concurrency
    level (the jobs sharing its GPU as it started), and a sized run alone
    into its line's sums; one atomic upsert."""
    column = "cold" if swapped else "warm"
    level = max(1, concurrency)
    log_size = math.log(size) if size is not None and size > 0 and level == 1 else None
    # A first run starts the sums when it is sized and warm.
    first = (log_size, math.log(max(seconds, MIN_RUN_SECONDS))) if not swapped else None
    x, y = first if first is not None and first[0] is not None else (None, None)
    with prepared_cursor() as cursor:
        cursor.execute(
            f"""
            INSERT INTO queueapp_runstats
                (model, path, concurrency, warm_seconds, warm_samples, cold_seconds,
                 cold_samples, updated_at, fit_weight, fit_x, fit_y, fit_xx, fit_xy, fit_yy)
            VALUES (%(model)s, %(path)s, %(concurrency)s, %(warm)s, %(warm_n)s, %(cold)s,
                    %(cold_n)s, now(), %(w0)s, %(x0)s, %(y0)s, %(xx0)s, %(xy0)s, %(yy0)s)
            ON CONFLICT (model, path, concurrency) DO UPDATE SET
                {column}_seconds = COALESCE(
                    queueapp_runstats.{column}_seconds * (1 - %(weight)s)
                    + %(seconds)s * %(weight)s,
                    %(seconds)s),
                {column}_samples = queueapp_runstats.{column}_samples + 1,
                updated_at = now(),
                {_FIT_UPDATES}
            """,
            {
                "model": model,
                "path": path,
                "concurrency": level,
                "seconds": seconds,
                "weight": NEWEST_RUN_WEIGHT,
                "warm": None if swapped else seconds,
                "warm_n": 0 if swapped else 1,
                "cold": seconds if swapped else None,
                "cold_n": 1 if swapped else 0,
                "swapped": swapped,
                "log_size": log_size,
                "min_run": MIN_RUN_SECONDS,
                "decay": FIT_DECAY,
                "w0": 0.0 if x is None else 1.0,
                "x0": x or 0.0,
                "y0": y or 0.0,
                "xx0": (x or 0.0) ** 2,
                "xy0": (x or 0.0) * (y or 0.0),
                "yy0": 0.0 if x is None else (y or 0.0) ** 2,
            },
        )
