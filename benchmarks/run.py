#!/usr/bin/env python
"""Benchmarks of the GPU dispatcher: the claim on a deep queue, and the gap between jobs.

Runs against its own database (``gpusched_bench``) on the server the project is
configured for (the embedded PostgreSQL unless DATABASE_URL is set), dropped
and recreated at every start so that runs are comparable. Prints a Markdown
table and rewrites the results section of docs/benchmarks.md.

The full run (`make bench`), then a quick check that leaves the doc alone:

    .venv/bin/python benchmarks/run.py
    .venv/bin/python benchmarks/run.py --jobs 10000 --finished 20000 --claims 100 \\
        --gap-jobs 50 --no-doc
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

# harness puts the project first on sys.path, before anything imports it.
from harness import (
    ROOT,
    GapSplit,
    bench_gpu,
    check_candidate_plan,
    explain,
    fmt_ms,
    fresh_database,
    gap_breakdown,
    gaps_ms,
    is_candidate_query,
    machine_info,
    mark_succeeded,
    percentile,
    plan_excerpt,
    set_paused,
    settle,
    sql_execute,
    write_between_markers,
)

from gpusched.stack import GpuCluster, Stack, wait_for

BENCH_DATABASE = "gpusched_bench"
DOC_PATH = ROOT / "docs" / "benchmarks.md"
RESULTS_START = "<!-- results:start -->"
RESULTS_END = "<!-- results:end -->"

MEMBERS = 50
MODELS = ("model-a", "model-b", "model-c")
RESIDENT_MODEL = "model-a"
GAP_MODEL = "bench-model"
# Mostly the three named bands, plus the odd explicit priority a member may set.
BANDS = (-100, 0, 100, -500, -20, 5, 50)
BAND_WEIGHTS = (20, 45, 20, 3, 4, 4, 4)
QUEUED_SPREAD_HOURS = 4.0
FINISHED_SPREAD_HOURS = 48.0
BATCH_SIZE = 5000
SEED = 20250101

CLAIM_P99_GOAL_MS = 5.0
GAP_P50_GOAL_MS = 20.0


# -- small helpers -------------------------------------------------------------------------


@dataclass
class Series:
    name: str
    samples_ms: list[float]
    goal: str
    goal_met: bool | None = None

    def stats(self) -> dict[str, float]:
        return {
            "p50": percentile(self.samples_ms, 50),
            "p95": percentile(self.samples_ms, 95),
            "p99": percentile(self.samples_ms, 99),
            "max": max(self.samples_ms),
        }


@dataclass
class StatementTiming:
    """One statement of the claim (or its commit), over the timed claims."""

    label: str
    per_claim: float
    ms: list[float]
    rows: list[float] | None  # returned or changed; None for the commit


@dataclass
class Report:
    args: argparse.Namespace
    machine: dict[str, str] = field(default_factory=dict)
    series: list[Series] = field(default_factory=list)
    candidate_sql: str = ""
    plan: str = ""  # EXPLAIN (ANALYZE, BUFFERS) of the candidate query
    plan_ok: bool = True
    plan_findings: list[str] = field(default_factory=list)
    claim_statements: list[StatementTiming] = field(default_factory=list)
    claim_sql_statements: int = 0
    claim_outside_ms: float = 0.0  # median of a claim outside execute and commit
    gap_splits: list[GapSplit] = field(default_factory=list)
    timings: list[tuple[str, float]] = field(default_factory=list)  # (what, seconds)
    started: float = field(default_factory=time.monotonic)

    def timed(self, what: str, seconds: float) -> None:
        self.timings.append((what, seconds))
        print(f"  {what}: {seconds:.2f} s", flush=True)


@contextmanager
def stopwatch() -> Iterator[list[float]]:
    box: list[float] = []
    start = time.perf_counter()
    try:
        yield box
    finally:
        box.append(time.perf_counter() - start)


# -- database ------------------------------------------------------------------------------


# -- seeding -------------------------------------------------------------------------------


def seed_jobs(args: argparse.Namespace, report: Report) -> list[Any]:
    """Members of every tier, `args.jobs` queued jobs and `args.finished` succeeded ones."""
    from queueapp.models import Job, JobStatus, Tier
    from queueapp.policy import rank_key
    from queueapp.selectors import db_now, policy_get
    from queueapp.services import member_create

    rng = random.Random(SEED)
    tiers = list(Tier.objects.order_by("bonus", "name"))
    members = [
        member_create(name=f"bench-{index:02d}", tier=tiers[index % len(tiers)])[0]
        for index in range(MEMBERS)
    ]
    aging_divisor = policy_get().aging_divisor
    now = db_now().timestamp()

    # Queued and finished rows interleave as they would in a table that has
    # been in use for a while, rather than sitting in separate blocks.
    statuses = [True] * args.jobs + [False] * args.finished
    rng.shuffle(statuses)

    def make(queued: bool) -> Job:
        member = rng.choice(members)
        model = rng.choice(MODELS)
        band = rng.choices(BANDS, BAND_WEIGHTS)[0]
        spread = QUEUED_SPREAD_HOURS if queued else FINISHED_SPREAD_HOURS
        submitted = now - rng.uniform(0, spread * 3600)
        submitted_dt = datetime.fromtimestamp(submitted, tz=UTC)
        prompt = f"question {rng.randrange(1_000_000)}: summarise the attached notes"
        job = Job(
            member=member,
            path="/v1/chat/completions",
            body={"model": model, "messages": [{"role": "user", "content": prompt}]},
            model=model,
            priority_requested=band,
            priority=band,
            submitted_at=submitted_dt,
            eligible_at=submitted_dt,
            rank_key=rank_key(
                band=band,
                tier_bonus=member.tier.bonus,
                eligible_at=submitted,
                aging_divisor=aging_divisor,
            ),
        )
        if not queued:
            started = submitted_dt + timedelta(seconds=rng.uniform(0, 600))
            job.status = JobStatus.SUCCEEDED
            job.started_at = started
            job.finished_at = started + timedelta(seconds=rng.uniform(0.5, 60))
            job.attempts = 1
            job.result_status_code = 200
            job.result_content_type = "application/json"
            job.result_body = {"choices": [{"message": {"content": "a short answer"}}]}
        return job

    with stopwatch() as took:
        for offset in range(0, len(statuses), BATCH_SIZE):
            batch = [make(queued) for queued in statuses[offset : offset + BATCH_SIZE]]
            Job.objects.bulk_create(batch, batch_size=BATCH_SIZE)
        # As job_submit would have left them: the first job of each queue
        # line (member, band, model) is its head (queueapp/lanes.py).
        sql_execute(
            "UPDATE queueapp_job SET is_lane_head = true WHERE id IN ("
            " SELECT DISTINCT ON (member_id, priority, model) id FROM queueapp_job"
            " WHERE status = 'queued'"
            " ORDER BY member_id, priority, model, submitted_at, id)"
        )
    report.timed(f"insert {args.jobs:,} queued + {args.finished:,} finished jobs", took[0])
    with stopwatch() as took:
        settle()
    report.timed("VACUUM ANALYZE, CHECKPOINT", took[0])
    return members


# -- claim benchmark -----------------------------------------------------------------------


LITERAL = re.compile(r"'(?:[^']|'')*'(?:::\w+)?|\b\d+(?:\.\d+)?\b|%\(\w+\)s|%s")


def statement_shape(sql: str) -> str:
    """A statement with its literals, select lists and join conditions left out, for grouping."""
    shape = " ".join(LITERAL.sub("?", sql).replace('"', "").split())
    shape = shape.replace("( ", "(").replace(" )", ")")
    shape = re.sub(r"\bqueueapp_\w+\.(?=\w)", "", shape)  # the ORM's column qualifiers
    shape = re.sub(
        r"\bSELECT ([^()]*?(?:\([^()]*\)[^()]*?)*?) FROM ",
        lambda match: "SELECT … FROM " if "," in match[1] else match[0],
        shape,
    )
    shape = re.sub(r"(INSERT INTO \w+) \([^()]*\) VALUES \([^()]*\)", r"\1 …", shape)
    shape = re.sub(r" JOIN (\w+)(?: AS \w+)? ON \S+ = \S+", r" JOIN \1", shape)
    shape = re.sub(
        r" SET ([^()]*?) WHERE ",
        lambda match: " SET " + ", ".join(re.findall(r"(\w+) = ", match.group(1))) + " WHERE ",
        shape,
    )
    return shape


def queueapp_caller() -> str:
    """The innermost function of the project on the stack: which part of the claim runs SQL."""
    frame = sys._getframe(1)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module.startswith("queueapp."):
            return f"{module}.{frame.f_code.co_name}"
        frame = frame.f_back
    return "?"


def claim_benchmark(args: argparse.Namespace, report: Report) -> None:
    from django.db import connection, connections
    from django.test.utils import CaptureQueriesContext

    from queueapp.dispatch.claim import ClaimedJob, job_claim_next

    # One claim, not timed, warms the caches and yields the SQL the claim runs,
    # with its parameters (the resident model among them) filled in, and the
    # function that runs each statement.
    callers: dict[str, str] = {}

    def name_sql(execute: Callable, sql: str, params: Any, many: bool, context: Any) -> Any:
        callers.setdefault(statement_shape(sql), queueapp_caller())
        return execute(sql, params, many, context)

    bench_gpu()  # registered before the capture: not part of a claim
    with CaptureQueriesContext(connection) as captured, connection.execute_wrapper(name_sql):
        outcome = job_claim_next(resident_model=RESIDENT_MODEL, worker="bench", gpu=bench_gpu())
    if not isinstance(outcome, ClaimedJob):
        raise RuntimeError(f"the first claim returned {outcome!r}, not a job")
    mark_succeeded(outcome.job_id)
    queries = [
        query["sql"]
        for query in captured.captured_queries
        if query["sql"] not in ("BEGIN", "COMMIT")
    ]
    report.claim_sql_statements = len(queries)
    candidates = [query for query in queries if is_candidate_query(query)]
    if len(candidates) == 1:
        report.candidate_sql = candidates[0]
        report.plan = explain(candidates[0])
        check = check_candidate_plan(candidates[0], report.plan)
        report.plan_ok = check.ok
        report.plan_findings.extend(check.findings)
    else:
        report.plan_ok = False
        report.plan_findings.append(
            f"NOT the expected claim: expected 1 candidate query, found {len(candidates)}"
        )

    # The time inside cursor.execute (statement sent, run, rows fetched), per
    # statement, and the commit's, separate the database's share of a claim
    # from Python's, and show which statement costs what. The candidate query
    # alone is what choosing the next job costs.
    in_sql = [0.0]
    per_statement: dict[str, list[tuple[float, int]]] = {}
    candidate_ms: list[float] = []
    commit_ms: list[float] = []

    def time_sql(execute: Callable, sql: str, params: Any, many: bool, context: Any) -> Any:
        start = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            took = time.perf_counter() - start
            in_sql[0] += took
            rows = getattr(context.get("cursor"), "rowcount", -1)
            # Grouped by the SQL text as sent; shaped after the timed claims.
            per_statement.setdefault(sql, []).append((took * 1000, rows))
            if is_candidate_query(sql):
                candidate_ms.append(took * 1000)

    # The commit goes through the connection, not a cursor; it waits for the
    # WAL flush of the claim's writes.
    wrapper = connections["default"]
    commit = wrapper.commit

    def timed_commit() -> None:
        start = time.perf_counter()
        try:
            commit()
        finally:
            commit_ms.append((time.perf_counter() - start) * 1000)
            in_sql[0] += commit_ms[-1] / 1000

    samples, outside = [], []
    wrapper.commit = timed_commit
    try:
        for _ in range(args.claims):
            in_sql[0] = 0.0
            with connection.execute_wrapper(time_sql):
                start = time.perf_counter()
                outcome = job_claim_next(
                    resident_model=RESIDENT_MODEL, worker="bench", gpu=bench_gpu()
                )
                samples.append((time.perf_counter() - start) * 1000)
            outside.append(samples[-1] - in_sql[0] * 1000)
            if not isinstance(outcome, ClaimedJob):
                raise RuntimeError(f"claim returned {outcome!r}, not a job")
            mark_succeeded(outcome.job_id)
    finally:
        del wrapper.commit  # the class's own method again
    by_shape: dict[str, list[tuple[float, int]]] = {}
    for sql, runs in per_statement.items():
        by_shape.setdefault(statement_shape(sql), []).extend(runs)
    for shape, runs in by_shape.items():
        caller = callers.get(shape, "?").removeprefix("queueapp.")
        sql = shape if len(shape) <= 120 else shape[:119] + "…"
        report.claim_statements.append(
            StatementTiming(
                f"`{caller}`: `{sql}`",
                len(runs) / args.claims,
                [ms for ms, _ in runs],
                [float(count) for _, count in runs],
            )
        )
    report.claim_statements.append(
        StatementTiming("`COMMIT`", len(commit_ms) / args.claims, commit_ms, None)
    )
    report.claim_outside_ms = percentile(outside, 50)
    goal = f"p99 < {CLAIM_P99_GOAL_MS:g} ms"
    if candidate_ms:
        choose = Series(
            f"choosing the next job (the candidate query), {args.jobs:,} queued",
            candidate_ms,
            goal=goal,
        )
        choose.goal_met = choose.stats()["p99"] < CLAIM_P99_GOAL_MS
        report.series.append(choose)
    claim = Series(f"whole claim (`job_claim_next`), {args.jobs:,} queued", samples, goal=goal)
    claim.goal_met = claim.stats()["p99"] < CLAIM_P99_GOAL_MS
    report.series.append(claim)


# -- dispatch gap benchmark ----------------------------------------------------------------


def wait_idle(cluster: GpuCluster, sim: Any, timeout: float) -> None:
    """Until no job runs and the simulator has answered everything it received."""
    from queueapp.models import Job, JobStatus

    def idle() -> bool:
        cluster.check_alive()
        running = Job.objects.filter(status=JobStatus.RUNNING).exists()
        return not running and all(entry["finished_at"] is not None for entry in sim.log())

    wait_for(idle, timeout=timeout, message="the dispatcher to go idle", interval=0.05)


def gap_with_backlog(
    args: argparse.Namespace, report: Report, cluster: GpuCluster, sim: Any
) -> None:
    """Gaps while the deep queue from the claim benchmark is dispatched."""
    from queueapp.models import Job, JobStatus
    from queueapp.selectors import db_now

    queued = Job.objects.filter(status=JobStatus.QUEUED).count()
    sim.reset_log()
    resumed_at = db_now()
    report.timed(f"resume dispatch with {queued:,} queued (policy_update)", set_paused(False))

    def served() -> bool:
        cluster.check_alive()
        return sum(1 for e in sim.log() if e["finished_at"] is not None) >= args.gap_jobs

    wait_for(
        served,
        timeout=60 + args.gap_jobs,
        message=f"{args.gap_jobs} requests at the simulator",
        interval=0.05,
    )
    report.timed("pause dispatch again (policy_update)", set_paused(True))
    wait_idle(cluster, sim, timeout=60)
    entries = sorted(sim.log(), key=lambda entry: entry["seq"])[: args.gap_jobs]
    refused = [entry for entry in entries if entry["status"] != 200]
    if refused:
        raise RuntimeError(f"the simulator refused {len(refused)} requests: {refused[:3]}")
    swaps = sum(1 for entry in entries if entry["swapped"])
    rows = list(
        Job.objects.filter(started_at__gte=resumed_at).values_list("started_at", "finished_at")
    )
    name = f"dispatch gap, {queued:,} queued"
    add_gap_series(
        report,
        Series(name, gaps_ms(entries), goal=f"p50 < {GAP_P50_GOAL_MS:g} ms"),
        gap_breakdown(
            name,
            rows,
            entries,
            note=f"{swaps} model swaps (free in the simulator) among {len(entries)} jobs",
        ),
    )


def gap_burst(
    args: argparse.Namespace, report: Report, cluster: GpuCluster, sim: Any, member: Any
) -> None:
    """Gaps while a burst of K fresh jobs is dispatched from an otherwise empty queue."""
    from django.db.models import Count

    from queueapp.models import Job, JobStatus
    from queueapp.services import job_submit

    ids = []
    with stopwatch() as took:
        for index in range(args.gap_jobs):
            body = {
                "model": GAP_MODEL,
                "messages": [{"role": "user", "content": f"benchmark request {index}"}],
            }
            job = job_submit(
                member=member,
                path="/v1/chat/completions",
                body=body,
                model=GAP_MODEL,
                priority_header=None,
            )
            ids.append(job.pk)
    report.timed(f"submit {args.gap_jobs} jobs (job_submit, dispatch paused)", took[0])
    sim.reset_log()
    report.timed("resume dispatch with an empty backlog (policy_update)", set_paused(False))

    def all_done() -> bool:
        cluster.check_alive()
        states = dict(
            Job.objects.filter(pk__in=ids).order_by().values_list("status").annotate(n=Count("id"))
        )
        failed = states.get(JobStatus.FAILED, 0) + states.get(JobStatus.CANCELLED, 0)
        if failed:
            raise RuntimeError(f"{failed} benchmark jobs did not succeed\n{cluster.tail()}")
        return states.get(JobStatus.SUCCEEDED, 0) == len(ids)

    wait_for(
        all_done, timeout=60 + args.gap_jobs, message=f"{len(ids)} jobs to succeed", interval=0.05
    )
    set_paused(True)
    wait_idle(cluster, sim, timeout=60)
    entries = [entry for entry in sim.log() if entry["model"] == GAP_MODEL]
    if len(entries) != len(ids):
        raise RuntimeError(f"the simulator saw {len(entries)} requests for {len(ids)} jobs")
    done = Job.objects.filter(pk__in=ids).order_by("started_at")
    rows = list(done.values_list("started_at", "finished_at"))
    name = "dispatch gap, empty backlog"
    add_gap_series(
        report,
        Series(name, gaps_ms(entries), goal=f"p50 < {GAP_P50_GOAL_MS:g} ms"),
        gap_breakdown(name, rows, entries),
    )


def add_gap_series(report: Report, series: Series, split: GapSplit) -> None:
    series.goal_met = series.stats()["p50"] < GAP_P50_GOAL_MS
    report.series.append(series)
    report.gap_splits.append(split)


def gap_benchmarks(
    args: argparse.Namespace, report: Report, bench_url: str, members: list[Any]
) -> None:
    from queueapp.upstream.simulator import LlamaSwapSimulator

    # Every request is answered at once, so what remains between two requests
    # is the dispatcher's own work: finish, recover, poll /running, claim, send.
    sim = LlamaSwapSimulator(
        models={GAP_MODEL: 0.0},
        default_seconds=0.0,
        accept_any_model=True,  # the backlog's models
        swap_seconds=0.0,
    ).start()
    log_dir = Path(tempfile.mkdtemp(prefix="gpusched-bench-"))
    stack = Stack(database_url=bench_url, log_dir=log_dir, upstream_url=sim.url)
    cluster: GpuCluster | None = None
    try:
        # Paused before the cluster starts, so that nothing is dispatched
        # before the measurement begins.
        took = set_paused(True)
        report.timed(f"pause dispatch with {args.jobs:,} queued (policy_update)", took)
        cluster = stack.start_cluster()
        print(f"  cluster log: {cluster.log_path}", flush=True)
        if args.backlog_gap and args.jobs:
            gap_with_backlog(args, report, cluster, sim)
        # Empty the queue; VACUUM stands in for the autovacuum that a live
        # system would have run by then, so the index is not full of dead rows.
        with stopwatch() as took:
            sql_execute(
                "UPDATE queueapp_job SET status = 'cancelled', finished_at = now() "
                "WHERE status = 'queued'"
            )
            settle()
        report.timed("cancel the backlog, VACUUM ANALYZE, CHECKPOINT", took[0])
        pro = next(member for member in members if member.tier.name == "pro")
        gap_burst(args, report, cluster, sim, pro)
    except Exception:
        if cluster is not None:
            print(f"cluster log tail:\n{cluster.tail()}", file=sys.stderr)
        raise
    finally:
        stack.stop()
        sim.stop()


# -- output --------------------------------------------------------------------------------


def results_table(report: Report) -> str:
    rows = [
        "| Benchmark | n | p50 ms | p95 ms | p99 ms | max ms | Goal | Met |",
        "|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for series in report.series:
        s = series.stats()
        met = {True: "yes", False: "**no**", None: "-"}[series.goal_met]
        rows.append(
            f"| {series.name} | {len(series.samples_ms)} | {s['p50']:.2f} | {s['p95']:.2f} "
            f"| {s['p99']:.2f} | {s['max']:.2f} | {series.goal} | {met} |"
        )
    return "\n".join(rows)


def summary_lines(report: Report) -> list[str]:
    """The verdicts under the figures: the two claim figures against the goal, the plan."""
    lines = []
    claim_figures = {
        "choosing the next job": "Choosing the next job (the candidate query alone, inside "
        "`cursor.execute`)",
        "whole claim": "The whole claim (from the caller: all its statements and the commit)",
    }
    for series in report.series:
        for prefix, what in claim_figures.items():
            if series.name.startswith(prefix):
                p99 = series.stats()["p99"]
                verdict = "meets" if series.goal_met else "does **not** meet"
                lines.append(f"{what}: p99 {p99:.2f} ms, {verdict} the {series.goal} goal.")
    verdict = "as expected" if report.plan_ok else "**NOT as expected**"
    lines.append(f"Plan of the candidate query: {verdict} (below).")
    return lines


def results_section(report: Report) -> str:
    args = report.args
    machine = {
        **report.machine,
        "Load average at end (1/5/15 min)": " / ".join(f"{v:.2f}" for v in os.getloadavg()),
    }
    out = [
        f"Run on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC with `--jobs {args.jobs} "
        f"--finished {args.finished} --claims {args.claims} --gap-jobs {args.gap_jobs}`; "
        f"the whole run took {time.monotonic() - report.started:.0f} s.",
        "",
        "### Machine",
        "",
        "| | |",
        "|---|---|",
        *(f"| {key} | {value} |" for key, value in machine.items()),
        "",
        "### Figures",
        "",
        results_table(report),
        "",
        *(f"- {line}" for line in summary_lines(report)),
        "",
        "### Plan of the candidate query",
        "",
        *(f"- {finding}" for finding in report.plan_findings),
        "",
    ]
    if report.plan:
        out += [
            f"The candidate query of one claim, resident model `{RESIDENT_MODEL}`:",
            "",
            "```sql",
            *(line.strip() for line in report.candidate_sql.splitlines() if line.strip()),
            "```",
            "",
            "Excerpt of its `EXPLAIN (ANALYZE, BUFFERS)`: the nodes with their actual rows and"
            " times, index conditions, sorts, the total buffers and the timing.",
            "",
            "```",
            plan_excerpt(report.plan),
            "```",
            "",
        ]
        if not report.plan_ok:
            out += ["The whole plan:", "", "```", report.plan, "```", ""]
    if report.claim_statements:
        out += [
            "### Statements of one claim",
            "",
            f"{report.claim_sql_statements} statements and the commit per claim.",
            "",
            "| Statement | Per claim | p50 ms | p95 ms | p99 ms | max ms | Rows p50 | Rows max |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for timing in report.claim_statements:
            ms = timing.ms
            rows = (
                f"{percentile(timing.rows, 50):g} | {max(timing.rows):g}"
                if timing.rows
                else "- | -"
            )
            out.append(
                f"| {timing.label} | {timing.per_claim:g} | {percentile(ms, 50):.2f} "
                f"| {percentile(ms, 95):.2f} | {percentile(ms, 99):.2f} | {max(ms):.2f} | {rows} |"
            )
        out += [
            "",
            f"Outside these, a claim spends a median {report.claim_outside_ms:.2f} ms in Python: "
            "the ranking and whatever else the claim computes between its statements, Django's "
            "transaction and cursor handling, and the on-commit callbacks.",
            "",
        ]
    if report.gap_splits:
        out += [
            "### Gap split",
            "",
            "Medians, ms.",
            "",
            "| Measurement | Answer sent → finish begins | Finish begins → claim begins "
            "| Claim begins → next request | Gaps split | Note |",
            "|---|---:|---:|---:|---:|---|",
        ]
        out += [
            f"| {split.name} | {fmt_ms(split.answer_to_finish)} | {fmt_ms(split.finish_to_claim)} "
            f"| {fmt_ms(split.claim_to_request)} | {split.matched} | {split.note or '-'} |"
            for split in report.gap_splits
        ]
    return "\n".join(out).rstrip() + "\n"


DOC_TEMPLATE = f"""# Benchmarks

`benchmarks/run.py` measures the two costs that decide how much GPU time the
dispatcher wastes: choosing the next job, and the idle time between two jobs.

## What is measured

**Claim.** `queueapp.dispatch.claim.job_claim_next`, over `--claims` claims
(default 500) with `--jobs` queued jobs (default 100,000) and `--finished`
succeeded ones (default 200,000) in the table. The queued jobs belong to 50
members of the three tiers, use three models, mostly the bands -100, 0 and
+100 with a few other priorities, and were submitted over the last four
hours; their `rank_key` comes from `queueapp.policy.rank_key`, and the first
job of each queue line (member, band, model) is its head, as `job_submit`
leaves them. After each claim the job is marked succeeded outside the timed
region, since the next claim would otherwise find the GPU busy. Two figures,
both against the goal of p99 under {CLAIM_P99_GOAL_MS:g} ms:

- *choosing the next job*: the claim's one candidate query, which takes the
  best line heads from the partial index `job_queued_rank` and those of the
  resident model (`{RESIDENT_MODEL}`) from `job_queued_model_rank`, a few from each,
  and locks them (`FOR UPDATE OF job SKIP LOCKED`). Its time is the time
  inside `cursor.execute`: statement sent, planned, run, rows fetched. The
  goal, "an index scan, not a sort of the queue", is about this figure.
- *the whole claim*, timed from the caller: the advisory lock, the read of
  the running job and the policy, the candidate query, the ranking in Python,
  the update of the chosen job, the lane update (the next head of its line,
  and the member's other line heads in the band, age from now), the audit
  inserts (decision and event), and the commit, which waits for the WAL
  flush.

The candidate query of one claim is captured and run again under
`EXPLAIN (ANALYZE, BUFFERS)`, rolled back. The plan passes when it reads both
`job_queued_rank` and `job_queued_model_rank` in rank order with an Index Scan
or Index Only Scan, has no Sort fed more rows than the query's LIMITs
together, and no sequential scan of the jobs table; otherwise the run exits
with status 1 and the doc shows the whole plan. Every statement of the timed
claims, and the commit, is also timed on its own (time inside
`cursor.execute`; the first statement's includes the `BEGIN` that psycopg
sends before it), with the function that runs it and the rows it returned or
changed.

**Dispatch gap.** A real `manage.py qcluster` (the "gpu" cluster, one
worker, queue poll 0.05 s) forwards jobs to an in-process llama-swap
simulator that answers every request at once. The gap is the simulator's idle
time between two requests, `received_at` of one minus `finished_at` of the
one before: everything the dispatcher does between two jobs (store the
answer, recover leases, ask llama-swap what is resident, claim, send).
Measured twice:

- with the deep queue left by the claim benchmark: dispatch is resumed and
  the first `--gap-jobs` requests (default 200) are measured, whatever their
  model (the aged backlog outranks any fresh job, so these are backlog jobs);
- with an empty backlog: the backlog is cancelled and vacuumed, dispatch is
  paused, `--gap-jobs` jobs are submitted with `job_submit`, dispatch is
  resumed and the run waits until all of them have succeeded.

Each gap is also split at the jobs' `finished_at` and `started_at` (the
database's clock at the start of the finish and claim transactions) into:
answer sent → finish begins, finish begins → claim begins, and claim begins →
next request arrives. Goal: p50 under {GAP_P50_GOAL_MS:g} ms.

The simulator sets `TCP_NODELAY` on its sockets, as llama-swap's Go server
does.

The run uses its own database, `{BENCH_DATABASE}`, on the configured server
(the embedded PostgreSQL unless `DATABASE_URL` is set), drops and recreates
it at every start so that runs are comparable, and leaves the server running.
After the seeding and after the backlog is cancelled it runs `VACUUM ANALYZE`
and `CHECKPOINT`, the state autovacuum and the checkpointer would soon reach,
so that their work on the setup's rows does not land in the measurements.
The figures are wall-clock times: other load on the machine (see the load
average below) moves them.

## How to run

```sh
make bench                                   # the full run
.venv/bin/python benchmarks/run.py --jobs 10000 --finished 20000 \\
    --claims 100 --gap-jobs 50 --no-doc      # a quick check, leaves this page alone
```

Without `--no-doc` a run rewrites the section below.

## Results

{RESULTS_START}
{RESULTS_END}
"""


def write_doc(report: Report) -> None:
    if not DOC_PATH.exists() or RESULTS_START not in DOC_PATH.read_text():
        DOC_PATH.parent.mkdir(parents=True, exist_ok=True)
        DOC_PATH.write_text(DOC_TEMPLATE)
    write_between_markers(
        DOC_PATH, RESULTS_START, RESULTS_END, heading="## Results", text=results_section(report)
    )


# -- main ----------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=100_000, help="queued jobs (default 100000)")
    parser.add_argument(
        "--finished", type=int, default=200_000, help="succeeded jobs (default 200000)"
    )
    parser.add_argument("--claims", type=int, default=500, help="timed claims (default 500)")
    parser.add_argument(
        "--gap-jobs", type=int, default=200, help="jobs per gap measurement (default 200)"
    )
    parser.add_argument(
        "--no-backlog-gap",
        dest="backlog_gap",
        action="store_false",
        help="skip the gap measurement with the deep queue",
    )
    parser.add_argument("--no-doc", dest="doc", action="store_false", help="leave the doc alone")
    parser.add_argument(
        "--claim-only",
        action="store_true",
        help="time the claim only and print its figures, by statement, as one JSON line (no doc)",
    )
    args = parser.parse_args(argv)
    if args.claims < 1 or args.gap_jobs < 2:
        parser.error("--claims must be >= 1 and --gap-jobs >= 2")
    if args.jobs < args.claims + 1 + (args.gap_jobs if args.backlog_gap else 0):
        parser.error("--jobs must exceed --claims + 1 (+ --gap-jobs for the backlog gap)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report = Report(args)
    bench_url = fresh_database(BENCH_DATABASE)
    report.machine = machine_info()

    print("seeding", flush=True)
    members = seed_jobs(args, report)
    print(f"claim benchmark: {args.claims} claims", flush=True)
    claim_benchmark(args, report)
    if args.claim_only:
        whole = report.series[-1].stats()
        figures = {"claim_p50_ms": whole["p50"], "claim_p99_ms": whole["p99"]}
        figures["outside_sql_p50_ms"] = report.claim_outside_ms
        figures["statements_p50_ms"] = {
            timing.label[:60]: percentile(timing.ms, 50) for timing in report.claim_statements
        }
        print(json.dumps(figures))
        return 0 if report.plan_ok else 1
    print(f"dispatch gap benchmark: {args.gap_jobs} jobs per measurement", flush=True)
    gap_benchmarks(args, report, bench_url, members)

    print()
    print(results_section(report))
    if args.doc:
        write_doc(report)
    # A goal missed on a slow machine is a figure to read; a claim that sorts
    # the queue is a regression.
    return 0 if report.plan_ok else 1


if __name__ == "__main__":
    sys.exit(main())
