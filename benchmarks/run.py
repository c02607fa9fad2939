#!/usr/bin/env python
"""Benchmarks of the GPU dispatcher: the claim on a deep queue, and the gap between jobs.

Runs against its own database (``gpusched_bench``) on the server the project is
configured for (the embedded PostgreSQL unless DATABASE_URL is set), dropped
and recreated at every start so that runs are comparable. Prints a Markdown
table and rewrites the results section of docs/benchmarks.md.

    .venv/bin/python benchmarks/run.py                       # the full run (make bench)
    .venv/bin/python benchmarks/run.py --jobs 10000 --claims 100 --gap-jobs 50 --no-doc
"""

from __future__ import annotations

import argparse
import bisect
import math
import os
import platform
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

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
CLUSTER_STOP_SECONDS = 15.0


# -- small helpers -------------------------------------------------------------------------


def percentile(values: list[float], pct: float) -> float:
    """Nearest-rank percentile: a value that was actually observed."""
    ordered = sorted(values)
    index = max(0, math.ceil(pct / 100 * len(ordered)) - 1)
    return ordered[index]


@dataclass
class Series:
    name: str
    samples_ms: list[float]
    goal: str
    goal_met: bool | None = None
    note: str = ""

    def stats(self) -> dict[str, float]:
        return {
            "p50": percentile(self.samples_ms, 50),
            "p95": percentile(self.samples_ms, 95),
            "p99": percentile(self.samples_ms, 99),
            "max": max(self.samples_ms),
        }


@dataclass
class Report:
    args: argparse.Namespace
    machine: dict[str, str] = field(default_factory=dict)
    series: list[Series] = field(default_factory=list)
    plans: list[tuple[str, str]] = field(default_factory=list)  # (label, plan text)
    # (statement shape, runs per claim, p50 ms, p95 ms, max ms, p50 rows, max rows)
    claim_statements: list[tuple[str, float, float, float, float, float, float]] = field(
        default_factory=list
    )
    plan_ok: bool = True
    plan_findings: list[str] = field(default_factory=list)
    timings: list[tuple[str, float]] = field(default_factory=list)  # (what, seconds)
    notes: list[str] = field(default_factory=list)
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


def wait_for(
    predicate: Callable[[], Any], *, timeout: float, what: str, interval: float = 0.05
) -> Any:
    """Poll until `predicate()` is truthy; raise after the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


# -- database ------------------------------------------------------------------------------


def configured_database_url() -> str:
    if os.environ.get("DATABASE_URL"):
        return os.environ["DATABASE_URL"]
    from gpusched import embedded_db

    return embedded_db.ensure_running()


def with_database_name(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + name))


def recreate_database(server_url: str, name: str) -> None:
    """Drop and create `name`, connected to the configured database of the same server."""
    import dj_database_url
    import psycopg
    from psycopg import sql

    db = dj_database_url.parse(server_url)
    params = {
        "dbname": db["NAME"],
        "user": db.get("USER") or None,
        "password": db.get("PASSWORD") or None,
        "host": db.get("HOST") or None,
        "port": db.get("PORT") or None,
        **db.get("OPTIONS", {}),
    }
    with psycopg.connect(
        **{k: v for k, v in params.items() if v is not None}, autocommit=True
    ) as conn:
        # FORCE ends sessions left over from an interrupted run (a cluster
        # that outlived its parent), which would otherwise block the drop.
        ident = sql.Identifier(name)
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(ident))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(ident))


def setup_django(bench_url: str) -> None:
    os.environ["DATABASE_URL"] = bench_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpusched.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)
    fixtures = sorted(str(path) for path in (ROOT / "fixtures").glob("*.json"))
    call_command("loaddata", *fixtures, verbosity=0)


def sql_execute(statement: str, params: list[Any] | None = None) -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.rowcount


def sql_value(statement: str) -> Any:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(statement)
        return cursor.fetchone()[0]


def settle() -> None:
    """Bring the table to the state autovacuum would leave it in, and flush the setup's writes.

    Without this, autovacuum and the checkpointer start on the setup's rows
    during the measurement and take their share of the two cores and the disk.
    """
    sql_execute("VACUUM ANALYZE queueapp_job, queueapp_member, queueapp_tier")
    try:
        sql_execute("CHECKPOINT")
    except Exception as exc:  # needs superuser or pg_checkpoint on a shared server
        print(f"  CHECKPOINT refused ({exc}); measuring without it", flush=True)


def machine_info() -> dict[str, str]:
    cpu_model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = "unknown"
    try:
        match = re.search(r"MemTotal:\s+(\d+) kB", Path("/proc/meminfo").read_text())
        if match:
            memory = f"{int(match.group(1)) / 1024 / 1024:.1f} GiB"
    except OSError:
        pass
    try:
        cores = str(len(os.sched_getaffinity(0)))  # what `nproc` reports
    except AttributeError:
        cores = str(os.cpu_count())
    import django

    return {
        "CPU cores (nproc)": cores,
        "CPU model": cpu_model,
        "Memory": memory,
        "PostgreSQL": sql_value("SELECT version()"),
        "Python": platform.python_version(),
        "Django": django.get_version(),
        "OS": platform.platform(),
        # Other work on the machine shows here, and in the figures.
        "Load average at start (1/5/15 min)": " / ".join(f"{v:.2f}" for v in os.getloadavg()),
    }


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


def mark_succeeded(job_id: int) -> None:
    sql_execute(
        "UPDATE queueapp_job SET status = 'succeeded', finished_at = now(), "
        "lease_expires_at = NULL WHERE id = %s",
        [job_id],
    )


def explain(statement: str, *, analyze: bool = True) -> str:
    """EXPLAIN (ANALYZE, BUFFERS) of a captured query, rolled back (it locks or writes rows)."""
    from django.db import connection, transaction

    options = "ANALYZE, BUFFERS" if analyze else "COSTS"
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(f"EXPLAIN ({options}) " + statement)
            lines = [row[0] for row in cursor.fetchall()]
        transaction.set_rollback(True)
    return "\n".join(lines)


def check_plan(label: str, plan: str, index: str, report: Report) -> None:
    uses_index = re.search(rf"Index Scan(?: Backward)? using {index}\b", plan) is not None
    sorts = [line.strip() for line in plan.splitlines() if re.search(r"\bSort\b", line)]
    seq_scans = [line.strip() for line in plan.splitlines() if "Seq Scan on queueapp_job" in line]
    if uses_index and not sorts and not seq_scans:
        report.plan_findings.append(f"{label}: Index Scan using `{index}`, no Sort node.")
        return
    report.plan_ok = False
    problems = []
    if not uses_index:
        problems.append(f"no Index Scan using `{index}`")
    problems.extend(f"`{line}`" for line in sorts + seq_scans)
    report.plan_findings.append(f"{label}: NOT the expected plan: " + "; ".join(problems))


LITERAL = re.compile(r"'(?:[^']|'')*'(?:::\w+)?|\b\d+(?:\.\d+)?\b")


def statement_shape(sql: str) -> str:
    """A statement with its literals, select list and join clauses left out, for grouping."""
    shape = LITERAL.sub("?", sql).replace("%s", "?").replace('"', "")
    shape = re.sub(r"\bqueueapp_\w+\.(?=\w)", "", shape)  # column qualifiers
    shape = re.sub(r"^SELECT .*? FROM ", "SELECT … FROM ", shape, flags=re.S)
    shape = re.sub(r"^INSERT INTO (\S+) .*", r"INSERT INTO \1", shape, flags=re.S)
    shape = re.sub(r" INNER JOIN (\S+) ON \(.*?\)", r" JOIN \1", shape)
    shape = re.sub(
        r" SET (.*?) WHERE ",
        lambda match: " SET " + ", ".join(re.findall(r"(\w+) = ", match.group(1))) + " WHERE ",
        shape,
    )
    return shape if len(shape) <= 200 else shape[:199] + "…"


def claim_benchmark(args: argparse.Namespace, report: Report) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from queueapp.dispatch.claim import ClaimedJob, job_claim_next

    # One claim, not timed, warms the caches and yields the SQL the claim runs.
    with CaptureQueriesContext(connection) as captured:
        outcome = job_claim_next(resident_model=RESIDENT_MODEL, worker="bench")
    if not isinstance(outcome, ClaimedJob):
        raise RuntimeError(f"the first claim returned {outcome!r}, not a job")
    mark_succeeded(outcome.job_id)
    queries = [
        query["sql"]
        for query in captured.captured_queries
        if query["sql"] not in ("BEGIN", "COMMIT")
    ]
    report.notes.append(f"One claim runs {len(queries)} SQL statements, plus BEGIN and COMMIT.")
    candidates = [q for q in queries if "rank_key" in q and "FOR UPDATE" in q.upper()]
    expected = [
        ("best queued job overall", "job_queued_rank"),
        (f"best queued job of the resident model ({RESIDENT_MODEL})", "job_queued_model_rank"),
    ]
    if len(candidates) != len(expected):
        report.plan_ok = False
        report.plan_findings.append(
            f"expected {len(expected)} candidate queries in the claim, found {len(candidates)}"
        )
    for (label, index), statement in zip(expected, candidates, strict=False):
        plan = explain(statement)
        report.plans.append((f"{label}\n\n{statement}", plan))
        check_plan(label, plan, index, report)
    # Any other write to the jobs table that is not by primary key touches an
    # unknown number of rows; its plan shows how they are found. Plan only: the
    # claim has already changed the rows it matched, so ANALYZE would see none.
    by_pk = re.compile(r'WHERE "queueapp_job"\."id" = \d+$')
    for statement in queries:
        if statement.startswith('UPDATE "queueapp_job"') and not by_pk.search(statement):
            label = "other write to the jobs table in the claim (plan only)"
            report.plans.append((f"{label}\n\n{statement}", explain(statement, analyze=False)))

    # The time spent inside cursor.execute (statement sent, run, rows fetched)
    # separates the database's share of a claim from the ORM's and Python's,
    # and shows which statement costs what.
    in_sql = [0.0]
    per_statement: dict[str, list[tuple[float, int]]] = {}

    def time_sql(execute: Callable, sql: str, params: Any, many: bool, context: Any) -> Any:
        start = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            took = time.perf_counter() - start
            in_sql[0] += took
            rows = getattr(context.get("cursor"), "rowcount", -1)
            per_statement.setdefault(statement_shape(sql), []).append((took * 1000, rows))

    samples, sql_samples = [], []
    for _ in range(args.claims):
        in_sql[0] = 0.0
        with connection.execute_wrapper(time_sql):
            start = time.perf_counter()
            outcome = job_claim_next(resident_model=RESIDENT_MODEL, worker="bench")
            samples.append((time.perf_counter() - start) * 1000)
        sql_samples.append(in_sql[0] * 1000)
        if not isinstance(outcome, ClaimedJob):
            raise RuntimeError(f"claim returned {outcome!r}, not a job")
        mark_succeeded(outcome.job_id)
    for shape, runs in per_statement.items():
        times = [ms for ms, _ in runs]
        rows = [float(count) for _, count in runs]
        report.claim_statements.append(
            (
                shape,
                len(runs) / args.claims,
                percentile(times, 50),
                percentile(times, 95),
                max(times),
                percentile(rows, 50),
                max(rows),
            )
        )
    series = Series(
        f"claim (`job_claim_next`), {args.jobs:,} queued",
        samples,
        goal=f"p99 < {CLAIM_P99_GOAL_MS:g} ms",
        note=(
            f"median {percentile(sql_samples, 50):.2f} ms of a claim is spent inside "
            f"`cursor.execute` (sending, running and fetching its statements); the rest is "
            f"the ORM building queries and model instances, the commit, and the ranking"
        ),
    )
    series.goal_met = series.stats()["p99"] < CLAIM_P99_GOAL_MS
    report.series.append(series)


# -- dispatch gap benchmark ----------------------------------------------------------------


class Cluster:
    """`manage.py qcluster` in its own process group, pointed at the bench database."""

    def __init__(self, database_url: str, upstream_url: str, log_path: Path) -> None:
        self.env = dict(
            os.environ,
            DATABASE_URL=database_url,
            LLAMA_SWAP_URL=upstream_url,
            GPUSCHED_QUEUE_POLL="0.05",
            PYTHONUNBUFFERED="1",
        )
        self.log_path = log_path
        self.process: subprocess.Popen | None = None

    def start(self) -> Cluster:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "manage.py", "qcluster"],
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def check_alive(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"the cluster exited with {self.process.returncode}\n{self.tail()}")

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        # The main process stops its sentinel, workers and pusher in order.
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=CLUSTER_STOP_SECONDS)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


PAUSE_ATTEMPTS = 5


def set_paused(paused: bool, report: Report) -> float:
    """Pause or resume dispatch the way an operator does; returns the seconds it took.

    The policy change rewrites every queued row while the dispatcher may be
    updating some of the same rows in a claim; PostgreSQL then aborts one of
    the two as a deadlock. An operator would try again, so the run does, and
    reports each time it happened.
    """
    from django.db import OperationalError

    from queueapp.services import policy_update

    what = "pause" if paused else "resume"
    start = time.perf_counter()
    for attempt in range(1, PAUSE_ATTEMPTS + 1):
        try:
            policy_update(changes={"dispatch_paused": paused})
            break
        except OperationalError as exc:
            if "deadlock" not in str(exc) or attempt == PAUSE_ATTEMPTS:
                raise
            first_line = str(exc).splitlines()[0]
            report.notes.append(
                f"`policy_update` ({what}) was aborted by PostgreSQL ({first_line}) while the "
                f"dispatcher was claiming; tried again (attempt {attempt + 1})."
            )
            print(f"  {what}: {first_line}; trying again", flush=True)
    return time.perf_counter() - start


def gaps_ms(entries: list[dict[str, Any]]) -> list[float]:
    """Idle time of the simulated GPU between consecutive requests."""
    ordered = sorted(entries, key=lambda entry: entry["seq"])
    return [
        (later["received_at"] - earlier["finished_at"]) * 1000
        for earlier, later in zip(ordered, ordered[1:], strict=False)
    ]


def gap_breakdown(rows: list[tuple[datetime, datetime]], entries: list[dict[str, Any]]) -> str:
    """Where a gap goes, from the jobs' database timestamps and the simulator's log.

    `started_at` and `finished_at` are the database's now(), the start of the
    claim and finish transactions; the simulator's times come from the same
    clock, and each request lies between its job's two.
    """
    spans = sorted((start.timestamp(), end.timestamp()) for start, end in rows if start and end)
    starts = [span[0] for span in spans]
    ordered = sorted(entries, key=lambda entry: entry["seq"])
    matched: list[tuple[float, float] | None] = []
    for entry in ordered:
        index = bisect.bisect_right(starts, entry["received_at"]) - 1
        span = spans[index] if index >= 0 else None
        matched.append(span if span and span[1] >= entry["finished_at"] else None)
    answer_to_finish, finish_to_claim, claim_to_send = [], [], []
    for index in range(len(ordered) - 1):
        this, following = matched[index], matched[index + 1]
        if this is None or following is None:
            continue
        answer_to_finish.append((this[1] - ordered[index]["finished_at"]) * 1000)
        finish_to_claim.append((following[0] - this[1]) * 1000)
        claim_to_send.append((ordered[index + 1]["received_at"] - following[0]) * 1000)
    if not answer_to_finish:
        return "no breakdown: no request matched its job's timestamps"
    unmatched = matched.count(None)
    return (
        f"median split of a gap: answer sent → finish transaction begins "
        f"{percentile(answer_to_finish, 50):.1f} ms; → claim transaction begins (finish, "
        f"lease recovery, queue check, `GET /running`) {percentile(finish_to_claim, 50):.1f} ms; "
        f"→ next request arrives (claim, heartbeat thread, send) "
        f"{percentile(claim_to_send, 50):.1f} ms"
        + (f" ({unmatched} requests matched no job)" if unmatched else "")
    )


def wait_idle(cluster: Cluster, sim: Any, timeout: float) -> None:
    """Until no job runs and the simulator has answered everything it received."""
    from queueapp.models import Job, JobStatus

    def idle() -> bool:
        cluster.check_alive()
        running = Job.objects.filter(status=JobStatus.RUNNING).exists()
        return not running and all(entry["finished_at"] is not None for entry in sim.log())

    wait_for(idle, timeout=timeout, what="the dispatcher to go idle")


def gap_with_backlog(args: argparse.Namespace, report: Report, cluster: Cluster, sim: Any) -> None:
    """Gaps while the deep queue from the claim benchmark is dispatched."""
    from queueapp.models import Job, JobStatus
    from queueapp.selectors import db_now

    queued = Job.objects.filter(status=JobStatus.QUEUED).count()
    sim.reset_log()
    resumed_at = db_now()
    took = set_paused(False, report)
    report.timed(f"resume dispatch with {queued:,} queued (policy_update)", took)

    def served() -> bool:
        cluster.check_alive()
        return sum(1 for e in sim.log() if e["finished_at"] is not None) >= args.gap_jobs

    wait_for(served, timeout=60 + args.gap_jobs, what=f"{args.gap_jobs} requests at the simulator")
    report.timed("pause dispatch again (policy_update)", set_paused(True, report))
    wait_idle(cluster, sim, timeout=60)
    entries = sorted(sim.log(), key=lambda entry: entry["seq"])[: args.gap_jobs]
    refused = [entry for entry in entries if entry["status"] != 200]
    if refused:
        raise RuntimeError(f"the simulator refused {len(refused)} requests: {refused[:3]}")
    swaps = sum(1 for entry in entries if entry["swapped"])
    rows = list(
        Job.objects.filter(started_at__gte=resumed_at).values_list("started_at", "finished_at")
    )
    series = Series(
        f"dispatch gap, {queued:,} queued",
        gaps_ms(entries),
        goal=f"p50 < {GAP_P50_GOAL_MS:g} ms",
        note=(
            f"{swaps} model swaps (free in the simulator) among {len(entries)} jobs; "
            + gap_breakdown(rows, entries)
        ),
    )
    series.goal_met = series.stats()["p50"] < GAP_P50_GOAL_MS
    report.series.append(series)


def gap_burst(
    args: argparse.Namespace,
    report: Report,
    cluster: Cluster,
    sim: Any,
    member: Any,
    *,
    name: str,
    goal: bool = True,
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
    report.timed("resume dispatch with an empty backlog (policy_update)", set_paused(False, report))

    def all_done() -> bool:
        cluster.check_alive()
        states = dict(
            Job.objects.filter(pk__in=ids).order_by().values_list("status").annotate(n=Count("id"))
        )
        failed = states.get(JobStatus.FAILED, 0) + states.get(JobStatus.CANCELLED, 0)
        if failed:
            raise RuntimeError(f"{failed} benchmark jobs did not succeed\n{cluster.tail()}")
        return states.get(JobStatus.SUCCEEDED, 0) == len(ids)

    wait_for(all_done, timeout=60 + args.gap_jobs, what=f"{len(ids)} jobs to succeed")
    # Paused again so that the next phase starts from the same state.
    set_paused(True, report)
    wait_idle(cluster, sim, timeout=60)
    entries = [entry for entry in sim.log() if entry["model"] == GAP_MODEL]
    if len(entries) != len(ids):
        raise RuntimeError(f"the simulator saw {len(entries)} requests for {len(ids)} jobs")
    done = Job.objects.filter(pk__in=ids).order_by("started_at")
    rows = list(done.values_list("started_at", "finished_at"))
    series = Series(
        name,
        gaps_ms(entries),
        goal=f"p50 < {GAP_P50_GOAL_MS:g} ms" if goal else "-",
        note=gap_breakdown(rows, entries),
    )
    if goal:
        series.goal_met = series.stats()["p50"] < GAP_P50_GOAL_MS
    report.series.append(series)


def gap_benchmarks(
    args: argparse.Namespace, report: Report, bench_url: str, members: list[Any]
) -> None:
    from queueapp.upstream import simulator as simulator_module
    from queueapp.upstream.simulator import LlamaSwapSimulator

    # llama-swap (Go's net/http) answers with TCP_NODELAY set. Python's
    # http.server writes the headers and the body in two sends with Nagle's
    # algorithm on, so the body waits for the client's delayed ACK (about 40 ms
    # on Linux) on every request; left alone, that wait would be measured as
    # dispatcher time. The setting is read when a connection is accepted.
    handler = simulator_module._Handler
    nagle_default = handler.disable_nagle_algorithm
    handler.disable_nagle_algorithm = True
    # Every request is answered at once, so what remains between two requests
    # is the dispatcher's own work: finish, recover, poll /running, claim, send.
    sim = LlamaSwapSimulator(
        models={GAP_MODEL: 0.0},
        default_seconds=0.0,
        accept_any_model=True,  # the backlog's models
        swap_seconds=0.0,
    ).start()
    log_dir = Path(tempfile.mkdtemp(prefix="gpusched-bench-"))
    cluster = Cluster(bench_url, sim.url, log_dir / "cluster.log")
    try:
        # Paused before the cluster starts, so that nothing is dispatched
        # before the measurement begins.
        took = set_paused(True, report)
        report.timed(f"pause dispatch with {args.jobs:,} queued (policy_update)", took)
        cluster.start()
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
        gap_burst(args, report, cluster, sim, pro, name="dispatch gap, empty backlog")
        if args.nagle_check:
            handler.disable_nagle_algorithm = nagle_default
            gap_burst(
                args,
                report,
                cluster,
                sim,
                pro,
                name="dispatch gap, empty backlog, simulator's sockets as shipped (Nagle on)",
                goal=False,
            )
    except Exception:
        print(f"cluster log tail:\n{cluster.tail()}", file=sys.stderr)
        raise
    finally:
        handler.disable_nagle_algorithm = nagle_default
        cluster.stop()
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
    ]
    notes = [f"{series.name}: {series.note}" for series in report.series if series.note]
    notes.extend(report.notes)
    if notes:
        out += [*(f"- {note}" for note in notes), ""]
    if report.claim_statements:
        out += [
            "### Statements of one claim",
            "",
            "Time inside `cursor.execute` per statement, over the timed claims; rows are"
            " those returned or changed.",
            "",
            "| Statement | Per claim | p50 ms | p95 ms | max ms | Rows p50 | Rows max |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        out += [
            f"| `{shape}` | {per_claim:g} | {p50:.2f} | {p95:.2f} | {top:.2f} | {rows50:g} "
            f"| {rows_max:g} |"
            for shape, per_claim, p50, p95, top, rows50, rows_max in report.claim_statements
        ]
        out.append("")
    out += ["### Other timings", "", "| Step | Seconds |", "|---|---:|"]
    out += [f"| {what} | {seconds:.2f} |" for what, seconds in report.timings]
    out += ["", "### Claim query plans", ""]
    out += [f"- {finding}" for finding in report.plan_findings]
    for label, plan in report.plans:
        title, _, statement = label.partition("\n\n")
        shape = statement_shape(statement)
        out += ["", f"{title}, `{shape}`:", "", "```", plan, "```"]
    return "\n".join(out).rstrip() + "\n"


DOC_TEMPLATE = f"""# Benchmarks

`benchmarks/run.py` measures the two costs that decide how much GPU time the
dispatcher wastes: choosing the next job, and the idle time between two jobs.

## What is measured

**Claim.** `queueapp.dispatch.claim.job_claim_next`, the whole transaction
the dispatcher runs to start a job (advisory lock, running-job check,
policy, the candidate queries, the writes to the chosen job and its decision
and event rows, and whatever else the claim writes), timed from the caller
over `--claims` claims (default 500) with `--jobs` queued jobs (default
100,000) and `--finished` succeeded ones (default 200,000) in the table. The
queued jobs belong to 50 members of the three tiers, use three models,
mostly the bands -100, 0 and +100 with a few other priorities, and were
submitted over the last four hours; their `rank_key` comes from
`queueapp.policy.rank_key`, as in `job_submit`. After each claim the job is
marked succeeded outside the timed region, since the next claim would
otherwise find the GPU busy. The claim's candidate queries are captured
during one claim and run again under `EXPLAIN (ANALYZE, BUFFERS)`: the run
checks that each is an Index Scan on its partial index (`job_queued_rank`,
`job_queued_model_rank`) and that no Sort of the queue appears; any other
update of the jobs table in the claim that is not by primary key has its
plan shown too. Every statement the claims run is also timed on its own
(time inside `cursor.execute`, and the rows it returned or changed), which
shows where a claim's time goes.
Goal: p99 under {CLAIM_P99_GOAL_MS:g} ms.

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
next request arrives.

Goal: p50 under {GAP_P50_GOAL_MS:g} ms.

The simulator is a Python `http.server`, which sends an answer's headers and
body in two writes with Nagle's algorithm on; the second write then waits for
the client's delayed ACK, about 40 ms on Linux, on every request (two per job:
`GET /running` and the job itself). llama-swap, written in Go, sets
`TCP_NODELAY` and has no such wait, so the run sets `TCP_NODELAY` on the
simulator's sockets for the measurements above, and measures the empty-backlog
case once more with the sockets as shipped, to show the size of that artefact
(skip it with `--no-nagle-check`).

The run also reports how long `policy_update` takes to pause and resume
dispatch: every policy change recomputes the stored `rank_key` of every queued
job in the same transaction. When PostgreSQL aborts that transaction as a
deadlock with a concurrent claim, the run tries again and says so under the
figures.

The run uses its own database, `{BENCH_DATABASE}`, on the configured server
(the embedded PostgreSQL unless `DATABASE_URL` is set), drops and recreates
it at every start so that runs are comparable, and leaves the server running.
After the seeding and after the backlog is cancelled it runs `VACUUM ANALYZE`
and `CHECKPOINT`, the state autovacuum and the checkpointer would soon reach,
so that their work on the setup's rows does not land in the measurements.
The figures are wall-clock times on a small machine: other load on it (see the
load average below) moves them.

## How to run

```sh
make bench                                   # the full run, about 2 minutes on 2 cores
.venv/bin/python benchmarks/run.py --jobs 10000 --finished 20000 \\
    --claims 100 --gap-jobs 50 --no-doc      # a quick check, leaves this page alone
```

Without `--no-doc` a run rewrites the section below.

## Results

{RESULTS_START}
{RESULTS_END}
"""


def write_doc(report: Report) -> None:
    text = DOC_PATH.read_text() if DOC_PATH.exists() else ""
    if RESULTS_START not in text or RESULTS_END not in text:
        text = DOC_TEMPLATE
    head, _, rest = text.partition(RESULTS_START)
    _, _, tail = rest.partition(RESULTS_END)
    DOC_PATH.parent.mkdir(parents=True, exist_ok=True)
    DOC_PATH.write_text(f"{head}{RESULTS_START}\n{results_section(report)}{RESULTS_END}{tail}")
    print(f"wrote {DOC_PATH.relative_to(ROOT)}")


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
    parser.add_argument(
        "--no-nagle-check",
        dest="nagle_check",
        action="store_false",
        help="skip the gap measurement against the simulator's unpatched sockets",
    )
    parser.add_argument("--no-doc", dest="doc", action="store_false", help="leave the doc alone")
    args = parser.parse_args(argv)
    if args.claims < 1 or args.gap_jobs < 2:
        parser.error("--claims must be >= 1 and --gap-jobs >= 2")
    if args.jobs < args.claims + 1 + (args.gap_jobs if args.backlog_gap else 0):
        parser.error("--jobs must exceed --claims + 1 (+ --gap-jobs for the backlog gap)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report = Report(args)
    server_url = configured_database_url()
    bench_url = with_database_name(server_url, BENCH_DATABASE)
    print(f"database {BENCH_DATABASE}: dropping, creating, migrating", flush=True)
    recreate_database(server_url, BENCH_DATABASE)
    setup_django(bench_url)
    report.machine = machine_info()

    print("seeding", flush=True)
    members = seed_jobs(args, report)
    print(f"claim benchmark: {args.claims} claims", flush=True)
    claim_benchmark(args, report)
    print(f"dispatch gap benchmark: {args.gap_jobs} jobs per measurement", flush=True)
    gap_benchmarks(args, report, bench_url, members)

    print()
    print(results_table(report))
    for series in report.series:
        if series.note:
            print(f"- {series.name}: {series.note}")
    for line in report.notes + report.plan_findings:
        print(f"- {line}")
    print(f"\ntotal: {time.monotonic() - report.started:.0f} s")
    if args.doc:
        write_doc(report)
    # A goal missed on a slow machine is a figure to read; a claim that sorts
    # the queue is a regression.
    return 0 if report.plan_ok else 1


if __name__ == "__main__":
    sys.exit(main())
