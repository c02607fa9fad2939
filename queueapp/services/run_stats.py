"""What finished jobs took, learned: the decayed averages that the
estimates read (queueapp/eta.py), written in the transaction that ends a
job."""

from __future__ import annotations

from queueapp.prepared import prepared_cursor

# Weight of the newest run in the decayed average: about the last 5 runs count.
NEWEST_RUN_WEIGHT = 0.3


def run_stats_record(
    *, model: str, path: str, seconds: float, swapped: bool, concurrency: int = 1
) -> None:
    """Fold one finished run into the decayed averages of its concurrency
    level (the jobs sharing its GPU as it started; one atomic upsert)."""
    column = "cold" if swapped else "warm"
    with prepared_cursor() as cursor:
        cursor.execute(
            f"""
            INSERT INTO queueapp_runstats
                (model, path, concurrency, warm_seconds, warm_samples, cold_seconds,
                 cold_samples, updated_at)
            VALUES (%(model)s, %(path)s, %(concurrency)s, %(warm)s, %(warm_n)s, %(cold)s,
                    %(cold_n)s, now())
            ON CONFLICT (model, path, concurrency) DO UPDATE SET
                {column}_seconds = COALESCE(
                    queueapp_runstats.{column}_seconds * (1 - %(weight)s)
                    + %(seconds)s * %(weight)s,
                    %(seconds)s),
                {column}_samples = queueapp_runstats.{column}_samples + 1,
                updated_at = now()
            """,
            {
                "model": model,
                "path": path,
                "concurrency": max(1, concurrency),
                "seconds": seconds,
                "weight": NEWEST_RUN_WEIGHT,
                "warm": None if swapped else seconds,
                "warm_n": 0 if swapped else 1,
                "cold": seconds if swapped else None,
                "cold_n": 1 if swapped else 0,
            },
        )
