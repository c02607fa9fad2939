#!/usr/bin/env python
"""Queue health over time: the claim on a table with a long history, and pruning it.

Fills its own database (``gpusched_queue_health`` on the configured server:
the embedded PostgreSQL unless DATABASE_URL is set, recreated at every start)
with `--finished` finished jobs spread over the last `--history-days` days,
with their audit events, dispatch decisions and some webhook deliveries, and
`--queued` queued jobs, all with INSERT … SELECT generate_series. Then:

1. the claim's candidate query under EXPLAIN (ANALYZE, BUFFERS): it must read
   the partial indexes in rank order, with no sequential scan of the jobs
   table (the same check as benchmarks/run.py), and its time over `--claims`
   real claims;
2. `retention.jobs_prune` with `--retention-days`, batch by batch (the time of
   each batch is how long its locks are held), and the sizes of the tables
   and indexes before, after, and after VACUUM;
3. the candidate query's plan and time again, after the prune.

Prints the results and rewrites the queue-health section of docs/benchmarks.md.

    .venv/bin/python benchmarks/queue_health.py          # make bench-queue-health
    .venv/bin/python benchmarks/queue_health.py --finished 100000 --queued 10000 --no-doc
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import harness  # benchmarks/harness.py: database set-up, plan check, percentile

ROOT = Path(__file__).resolve().parent.parent
DATABASE = "gpusched_queue_health"
DOC_PATH = ROOT / "docs" / "benchmarks.md"
START, END = "<!-- queue-health:start -->", "<!-- queue-health:end -->"
MEMBERS = 200
MODELS = ("model-a", "model-b", "model-c", "model-d", "model-e")
RESIDENT_MODEL = "model-a"
CLAIM_P99_GOAL_MS = 5.0
TABLES = (
    "queueapp_job",
    "queueapp_jobevent",
    "queueapp_dispatchdecision",
    "queueapp_webhookdelivery",
    "queueapp_webhookattempt",
)


@dataclass
class Sizes:
    label: str
    rows: dict[str, int]
    table_bytes: dict[str, int]  # heap + TOAST, without indexes
    index_bytes: dict[str, int]  # per index of queueapp_job, and "other tables' indexes"


@dataclass
class PlanRun:
    label: str
    plan: str
    ok: bool
    findings: list[str]
    query_ms: list[float]  # the candidate query inside cursor.execute
    claim_ms: list[float]  # the whole claim


@dataclass
class Outcome:
    timings: list[tuple[str, float]] = field(default_factory=list)
    sizes: list[Sizes] = field(default_factory=list)
    plans: list[PlanRun] = field(default_factory=list)
    candidate_sql: str = ""
    prune_batches_ms: list[float] = field(default_factory=list)
    pruned: Any = None  # retention.PruneCounts
    prune_seconds: float = 0.0
    queued: tuple[int, int] = (0, 0)  # before and after the prune

    def timed(self, what: str, seconds: float) -> None:
        self.timings.append((what, seconds))
        print(f"  {what}: {seconds:.1f} s", flush=True)


def sql(statement: str, params: Any = None) -> int:
    return harness.sql_execute(statement, params)


# A random member, band and model per row: the subquery names `g`, so it
# runs for each row (an uncorrelated one would run once for all of them).
PICK = """
    CROSS JOIN LATERAL (
        SELECT (%(members)s::bigint[])[1 + floor(random() * %(n_members)s)::int],
               (%(bands)s::int[])[1 + floor(random() * %(n_bands)s)::int],
               (%(models)s::text[])[1 + floor(random() * %(n_models)s)::int]
         WHERE g IS NOT NULL
    ) AS pick(member_id, band, model)
"""


def pick_params() -> dict[str, Any]:
    from queueapp.models import Member

    members = list(Member.objects.values_list("pk", flat=True))
    # Mostly the three named bands, a few other priorities.
    bands = [-100] * 20 + [0] * 45 + [100] * 20 + [-500] * 3 + [-20] * 4 + [5] * 4 + [50] * 4
    return {
        "members": members,
        "n_members": len(members),
        "bands": bands,
        "n_bands": len(bands),
        "models": list(MODELS),
        "n_models": len(MODELS),
    }


def insert_finished(n: int, *, newest_days_ago: float, span_days: float) -> None:
    """`n` finished jobs that ended evenly over `span_days` up to `newest_days_ago`,
    each with two events, a decision when it ran, and for one in 20 a webhook."""
    first_new = harness.sql_value("SELECT coalesce(max(id), 0) FROM queueapp_job") + 1
    sql(
        f"""
        INSERT INTO queueapp_job (
            member_id, priority, model, path, body, priority_requested, status,
            submitted_at, eligible_at, rank_key, is_lane_head, started_at, finished_at,
            lease_owner, attempts, gpu_slot, result_status_code, result_content_type,
            result_body, result_file, error, callback_url, front_door, chain_id)
        SELECT pick.member_id, pick.band, pick.model, '/v1/chat/completions',
               jsonb_build_object('model', pick.model, 'messages', jsonb_build_array(
                   jsonb_build_object('role', 'user', 'content', 'question ' || g))),
               pick.band, ended.status, ended.at - interval '5 minutes',
               ended.at - interval '5 minutes', 0, false, ended.at - interval '40 seconds',
               ended.at, '', 1, 0,
               CASE ended.status WHEN 'succeeded' THEN 200 WHEN 'failed' THEN 500 END,
               'application/json',
               CASE ended.status WHEN 'succeeded'
                    THEN '{{"choices": [{{"message": {{"content": "a short answer"}}}}]}}'::jsonb
               END,
               '', CASE ended.status WHEN 'failed' THEN 'llama-swap answered 500' ELSE '' END,
               CASE WHEN g %% 20 = 0 THEN 'https://example.com/hook' ELSE '' END, false, ''
          FROM generate_series(1, %(n)s) AS g
          {PICK}
         CROSS JOIN LATERAL (
               SELECT now() - %(newest)s * interval '1 day'
                      - (%(n)s - g) * (%(span)s * interval '1 day') / %(n)s,
                      CASE WHEN g %% 100 < 90 THEN 'succeeded'
                           WHEN g %% 100 < 97 THEN 'failed' ELSE 'cancelled' END
               ) AS ended(at, status)
        """,
        {**pick_params(), "n": n, "newest": newest_days_ago, "span": span_days},
    )
    new = {"first": first_new}
    sql(
        """
        INSERT INTO queueapp_jobevent (job_id, at, kind, detail)
        SELECT job.id, CASE kind WHEN 'submitted' THEN job.submitted_at ELSE job.finished_at END,
               kind, '{}'::jsonb
          FROM queueapp_job AS job
         CROSS JOIN (VALUES ('submitted'), ('finished')) AS kinds(kind)
         WHERE job.id >= %(first)s
        """,
        new,
    )
    sql(
        """
        INSERT INTO queueapp_dispatchdecision (
            at, job_id, band, terms, candidates, resident_model, swap_needed, policy,
            counterfactuals, changed_by_aging, changed_by_swap_affinity, changed_by_tier_bonus,
            changed_by_fairness, idle_seconds)
        SELECT job.started_at, job.id, job.priority,
               jsonb_build_object('band', job.priority, 'tier_bonus', 1, 'swap_affinity', 10,
                                  'aging', 0.5, 'effective', job.priority + 11.5),
               '[]'::jsonb, job.model, false, '{"aging_divisor": 60}'::jsonb, '{}'::jsonb,
               false, job.id %% 7 = 0, job.id %% 11 = 0, job.id %% 5 = 0, 0.01
          FROM queueapp_job AS job
         WHERE job.id >= %(first)s AND job.status IN ('succeeded', 'failed')
        """,
        new,
    )
    sql(
        """
        INSERT INTO queueapp_webhookdelivery (
            job_id, event_type, webhook_id, url, payload, status, attempts, next_attempt_at,
            created_at, delivered_at, last_error)
        SELECT job.id, 'job.' || job.status, 'msg_' || job.id, job.callback_url, '{}'::jsonb,
               'delivered', 1, job.finished_at, job.finished_at, job.finished_at, ''
          FROM queueapp_job AS job
         WHERE job.id >= %(first)s AND job.callback_url <> ''
        """,
        new,
    )
    sql(
        """
        INSERT INTO queueapp_webhookattempt (delivery_id, at, status_code, duration_ms, error)
        SELECT delivery.id, delivery.delivered_at, 200, 35.0, ''
          FROM queueapp_webhookdelivery AS delivery
         WHERE delivery.job_id >= %(first)s
        """,
        new,
    )


def fill(args: argparse.Namespace, outcome: Outcome) -> None:
    """Members of every tier; finished jobs with their rows; queued jobs with line heads."""
    from queueapp.models import Tier
    from queueapp.policy import AGING_EPOCH_SECONDS
    from queueapp.selectors import policy_get
    from queueapp.services import member_create

    tiers = list(Tier.objects.order_by("bonus", "name"))
    for n in range(MEMBERS):
        member_create(name=f"health-{n:03d}", tier=tiers[n % len(tiers)])
    sql("SET synchronous_commit = off")  # the fill only; nothing is measured here
    start = time.perf_counter()
    insert_finished(args.finished, newest_days_ago=0, span_days=args.history_days)
    outcome.timed(
        f"insert {args.finished:,} finished jobs with their events, decisions, webhooks",
        time.perf_counter() - start,
    )
    start = time.perf_counter()
    sql(
        f"""
        INSERT INTO queueapp_job (
            member_id, priority, model, path, body, priority_requested, status,
            submitted_at, eligible_at, rank_key, is_lane_head, lease_owner, attempts, gpu_slot,
            result_content_type, result_file, error, callback_url, front_door, chain_id)
        SELECT pick.member_id, pick.band, pick.model, '/v1/chat/completions',
               jsonb_build_object('model', pick.model, 'messages', jsonb_build_array(
                   jsonb_build_object('role', 'user', 'content', 'question ' || g))),
               pick.band, 'queued', at, at, 0, false, '', 0, 0, '', '', '', '', false, ''
          FROM generate_series(1, %(n)s) AS g
          {PICK}
         CROSS JOIN LATERAL (
               SELECT now() - random() * interval '4 hours' WHERE g IS NOT NULL
               ) AS submitted(at)
        """,
        {**pick_params(), "n": args.queued},
    )
    # As job_submit leaves them: the first job of each queue line is its
    # head, and heads carry the key the claim orders by.
    sql(
        "UPDATE queueapp_job SET is_lane_head = true WHERE id IN ("
        " SELECT DISTINCT ON (member_id, priority, model) id FROM queueapp_job"
        " WHERE status = 'queued' ORDER BY member_id, priority, model, submitted_at, id)"
    )
    sql(
        """
        UPDATE queueapp_job AS job
           SET rank_key = job.priority + tier.bonus
                          - (EXTRACT(EPOCH FROM job.eligible_at)::float8 - %s) / %s
          FROM queueapp_member AS member JOIN queueapp_tier AS tier ON tier.id = member.tier_id
         WHERE job.member_id = member.id AND job.status = 'queued'
        """,
        [AGING_EPOCH_SECONDS, policy_get().aging_divisor],
    )
    outcome.timed(
        f"insert {args.queued:,} queued jobs, mark line heads", time.perf_counter() - start
    )
    sql("SET synchronous_commit = on")
    start = time.perf_counter()
    vacuum_analyze()
    outcome.timed("VACUUM ANALYZE, CHECKPOINT", time.perf_counter() - start)


def vacuum_analyze() -> None:
    sql("VACUUM ANALYZE " + ", ".join(TABLES) + ", queueapp_member, queueapp_tier")
    try:
        sql("CHECKPOINT")
    except Exception as exc:  # needs superuser or pg_checkpoint on a shared server
        print(f"  CHECKPOINT refused ({exc})", flush=True)


def sizes(label: str) -> Sizes:
    from django.db import connection

    with connection.cursor() as cursor:
        rows = {}
        table_bytes = {}
        for table in TABLES:
            cursor.execute(f"SELECT count(*) FROM {table}")
            rows[table] = cursor.fetchone()[0]
            cursor.execute(
                "SELECT pg_total_relation_size(%s) - pg_indexes_size(%s)", [table, table]
            )
            table_bytes[table] = cursor.fetchone()[0]
        cursor.execute(
            """
            SELECT index.relname, pg_relation_size(index.oid)
              FROM pg_index JOIN pg_class AS index ON index.oid = pg_index.indexrelid
             WHERE pg_index.indrelid = 'queueapp_job'::regclass
             ORDER BY 2 DESC
            """
        )
        index_bytes = dict(cursor.fetchall())
        cursor.execute(
            "SELECT sum(pg_indexes_size(name::regclass)) FROM unnest(%s::text[]) AS name",
            [list(TABLES[1:])],
        )
        index_bytes["(indexes of the other four tables)"] = int(cursor.fetchone()[0])
    return Sizes(label, rows, table_bytes, index_bytes)


def capture_candidate_query() -> str:
    """One real claim; its candidate query with the parameters filled in."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from queueapp.dispatch.claim import ClaimedJob, job_claim_next

    harness.bench_gpu()  # registered before the capture: not part of a claim
    with CaptureQueriesContext(connection) as captured:
        outcome = job_claim_next(
            resident_model=RESIDENT_MODEL, worker="bench", gpu=harness.bench_gpu()
        )
    if not isinstance(outcome, ClaimedJob):
        raise RuntimeError(f"the claim returned {outcome!r}, not a job")
    harness.mark_succeeded(outcome.job_id)
    found = [q["sql"] for q in captured.captured_queries if harness.is_candidate_query(q["sql"])]
    if len(found) != 1:
        raise RuntimeError(f"expected one candidate query in a claim, found {len(found)}")
    return found[0]


def measure_claims(label: str, statement: str, args: argparse.Namespace) -> PlanRun:
    """EXPLAIN the candidate query, then time `args.claims` real claims."""
    from django.db import connection

    from queueapp.dispatch.claim import ClaimedJob, job_claim_next

    plan = harness.explain(statement)
    check = harness.check_candidate_plan(statement, plan)
    query_ms: list[float] = []
    claim_ms: list[float] = []

    def time_candidates(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        start = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            if harness.is_candidate_query(sql):
                query_ms.append((time.perf_counter() - start) * 1000)

    with connection.execute_wrapper(time_candidates):
        for _ in range(args.claims):
            start = time.perf_counter()
            outcome = job_claim_next(
                resident_model=RESIDENT_MODEL, worker="bench", gpu=harness.bench_gpu()
            )
            claim_ms.append((time.perf_counter() - start) * 1000)
            if not isinstance(outcome, ClaimedJob):
                raise RuntimeError(f"claim returned {outcome!r}, not a job")
            harness.mark_succeeded(outcome.job_id)
    result = PlanRun(label, plan, check.ok, check.findings, query_ms, claim_ms)
    q, c = result.query_ms, result.claim_ms
    print(
        f"  {label}: plan {'as expected' if result.ok else 'NOT as expected'};"
        f" candidate query p50 {harness.percentile(q, 50):.2f} ms,"
        f" p99 {harness.percentile(q, 99):.2f} ms;"
        f" whole claim p50 {harness.percentile(c, 50):.2f} ms",
        flush=True,
    )
    return result


def prune(args: argparse.Namespace, outcome: Outcome) -> None:
    """`jobs_prune`'s loop, with each batch (one transaction) timed."""
    from queueapp.retention import PRUNE_BATCH_SIZE, PruneCounts, jobs_prune_batch
    from queueapp.selectors import db_now

    cutoff = db_now() - timedelta(days=args.retention_days)
    total = PruneCounts()
    start = time.perf_counter()
    while True:
        batch_start = time.perf_counter()
        batch = jobs_prune_batch(finished_before=cutoff, batch_size=PRUNE_BATCH_SIZE)
        outcome.prune_batches_ms.append((time.perf_counter() - batch_start) * 1000)
        total += batch
        if batch.jobs < PRUNE_BATCH_SIZE:
            break
    outcome.prune_seconds = time.perf_counter() - start
    outcome.pruned = total
    outcome.timed(
        f"prune {total.jobs:,} jobs finished over {args.retention_days} days ago"
        f" ({total.batches} batches)",
        outcome.prune_seconds,
    )


def mib(n: int) -> str:
    return f"{n / 1024 / 1024:,.1f}"


def plan_table(plans: list[PlanRun], args: argparse.Namespace) -> list[str]:
    lines = [
        "| Table state | Plan | Candidate query p50 ms | p99 ms | Whole claim p50 ms | p99 ms |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for p in plans:
        q, c = p.query_ms, p.claim_ms
        lines.append(
            f"| {p.label} | {'index scans, as expected' if p.ok else '**not as expected**'}"
            f" | {harness.percentile(q, 50):.2f} | {harness.percentile(q, 99):.2f}"
            f" | {harness.percentile(c, 50):.2f} | {harness.percentile(c, 99):.2f} |"
        )
    return lines


def sizes_table(all_sizes: list[Sizes]) -> list[str]:
    head = "| | " + " | ".join(s.label for s in all_sizes) + " |"
    lines = [head, "|---|" + "---:|" * len(all_sizes)]
    for table in TABLES:
        lines.append(
            f"| `{table}` rows | " + " | ".join(f"{s.rows[table]:,}" for s in all_sizes) + " |"
        )
    for table in TABLES:
        lines.append(
            f"| `{table}` table MiB | "
            + " | ".join(mib(s.table_bytes[table]) for s in all_sizes)
            + " |"
        )
    for index in all_sizes[0].index_bytes:
        name = index if index.startswith("(") else f"`{index}`"
        lines.append(
            f"| {name} MiB | "
            + " | ".join(mib(s.index_bytes.get(index, 0)) for s in all_sizes)
            + " |"
        )
    return lines


def section(args: argparse.Namespace, machine: dict[str, str], outcome: Outcome) -> str:
    def grew(*, tables: bool) -> str:
        def total(size: Sizes) -> int:
            return sum((size.table_bytes if tables else size.index_bytes).values())

        return f"{mib(total(outcome.sizes[-2]))} MiB to {mib(total(outcome.sizes[-1]))} MiB"

    pruned = outcome.pruned
    batches = outcome.prune_batches_ms
    first = outcome.plans[0]
    ok = all(p.ok for p in outcome.plans)
    return "\n".join(
        [
            f"Run on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {machine['CPU cores (nproc)']} cores"
            f" (nproc; {machine['CPU model']}), load average at start"
            f" {machine['Load average at start (1/5/15 min)']}:",
            "",
            "```sh",
            f".venv/bin/python benchmarks/queue_health.py --finished {args.finished}"
            f" --queued {args.queued} --history-days {args.history_days}"
            f" --retention-days {args.retention_days} --claims {args.claims}",
            "```",
            "",
            f"The database `{DATABASE}` holds {args.finished:,} finished jobs (90 % succeeded,"
            f" 7 % failed, 3 % cancelled) that ended evenly over the last {args.history_days}"
            f" days, each with two audit events, a dispatch decision when it ran, and for one in"
            f" 20 a delivered webhook with its attempt; and {args.queued:,} queued jobs"
            f" submitted over the last 4 hours. Both belong to {MEMBERS} members of the three"
            f" tiers, use {len(MODELS)} models and mostly the bands -100, 0 and +100; the first"
            " job of each queue line is its head, as `job_submit` leaves them. Then"
            f" {args.claims} real claims (`job_claim_next`, resident model `{RESIDENT_MODEL}`),"
            f" a prune with a {args.retention_days}-day retention, and the claims again.",
            "",
            "Setup: " + "; ".join(f"{what} {seconds:.0f} s" for what, seconds in outcome.timings),
            "",
            "### The claim with a long history",
            "",
            *plan_table(outcome.plans, args),
            "",
            f"Plan of the candidate query: {'as expected' if ok else '**not as expected**'}"
            " in both states. "
            + " ".join(first.findings)
            + f" Goal for the candidate query, p99 under {CLAIM_P99_GOAL_MS:g} ms:"
            + (
                " met."
                if all(
                    harness.percentile(p.query_ms, 99) < CLAIM_P99_GOAL_MS for p in outcome.plans
                )
                else " **not met**."
            ),
            "",
            f"`EXPLAIN (ANALYZE, BUFFERS)` excerpt with {args.finished:,} finished and"
            f" {args.queued:,} queued jobs:",
            "",
            "```",
            harness.plan_excerpt(first.plan),
            "```",
            "",
            "### Pruning",
            "",
            f"`retention.jobs_prune` removed {pruned.jobs:,} jobs with {pruned.events:,} events,"
            f" {pruned.decisions:,} decisions, {pruned.webhook_deliveries:,} webhook deliveries"
            f" and {pruned.webhook_attempts:,} attempts in {outcome.prune_seconds:.1f} s"
            f" ({pruned.jobs / outcome.prune_seconds:,.0f} jobs per second), in"
            f" {pruned.batches} transactions of up to 2,000 jobs: per batch p50"
            f" {harness.percentile(batches, 50):.0f} ms,"
            f" p99 {harness.percentile(batches, 99):.0f} ms,"
            f" max {max(batches):.0f} ms, the longest any row lock of the prune is held."
            f" Queued jobs before and after: {outcome.queued[0]:,} and {outcome.queued[1]:,} (the"
            " prune never touches them).",
            "",
            *sizes_table(outcome.sizes),
            "",
            "Plain `VACUUM` (what autovacuum does) does not give the space back to the"
            " operating system; it makes it free for new rows. The last column shows it: as many"
            " new finished jobs as were pruned, with their rows, inserted after the VACUUM,"
            f" took the freed space: the five tables went from {grew(tables=True)}, their"
            f" indexes from {grew(tables=False)}. With a daily prune the tables stay at about"
            " the size of one retention period of jobs instead of growing. `VACUUM FULL` or"
            " `pg_repack` would shrink the files but lock the table.",
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--finished", type=int, default=1_000_000)
    parser.add_argument("--queued", type=int, default=100_000)
    parser.add_argument("--history-days", type=int, default=60)
    parser.add_argument("--retention-days", type=int, default=30)
    parser.add_argument("--claims", type=int, default=200)
    parser.add_argument("--no-doc", dest="doc", action="store_false", help="leave the doc alone")
    args = parser.parse_args(argv)

    started = time.perf_counter()
    harness.fresh_database(DATABASE)
    machine = harness.machine_info()
    # One JSON line per claim otherwise; the decisions are not what this measures.
    logging.getLogger("gpusched.decisions").setLevel(logging.WARNING)
    outcome = Outcome()
    fill(args, outcome)
    outcome.sizes.append(sizes("filled"))
    outcome.candidate_sql = capture_candidate_query()
    outcome.plans.append(
        measure_claims(
            f"{args.finished:,} finished, {args.queued:,} queued", outcome.candidate_sql, args
        )
    )
    queued_before = harness.sql_value("SELECT count(*) FROM queueapp_job WHERE status = 'queued'")
    prune(args, outcome)
    queued_after = harness.sql_value("SELECT count(*) FROM queueapp_job WHERE status = 'queued'")
    outcome.queued = (queued_before, queued_after)
    if queued_after != queued_before:
        raise RuntimeError(f"the prune changed the queue: {queued_before} -> {queued_after}")
    outcome.sizes.append(sizes("after the prune"))
    start = time.perf_counter()
    # Twice, as autovacuum would have run by the next day: index pages that
    # one VACUUM deletes can only be reused after a later one.
    vacuum_analyze()
    vacuum_analyze()
    outcome.timed("VACUUM ANALYZE (twice) after the prune", time.perf_counter() - start)
    outcome.sizes.append(sizes("after VACUUM"))
    outcome.plans.append(
        measure_claims(
            f"after the prune ({outcome.sizes[-1].rows['queueapp_job']:,} jobs left)",
            capture_candidate_query(),
            args,
        )
    )
    # The next retention period's jobs arrive; the space the prune freed takes them.
    start = time.perf_counter()
    refill = outcome.pruned.jobs
    insert_finished(refill, newest_days_ago=0, span_days=0.01)
    vacuum_analyze()
    outcome.timed(
        f"insert {refill:,} new finished jobs, VACUUM ANALYZE", time.perf_counter() - start
    )
    outcome.sizes.append(sizes("+ as many new jobs"))
    outcome.timed("whole run", time.perf_counter() - started)
    text = section(args, machine, outcome)
    print()
    print(text)
    if args.doc:
        harness.write_between_markers(DOC_PATH, START, END, heading="## Queue health", text=text)
    return 0 if all(p.ok for p in outcome.plans) else 1


if __name__ == "__main__":
    sys.exit(main())
