"""What the benchmarks share: their own database, the machine they ran on, the
claim's plan check, the dispatch gap's arithmetic and the doc they write.

Each benchmark script (run.py for `make bench`, frontdoor.py, load.py,
queue_health.py, websocket_fanout.py) imports this module, never another
script; the processes they start come from gpusched/stack.py, as the
end-to-end tests' do. Django is set up by `fresh_database`, so what needs it
imports it inside the function.
"""

from __future__ import annotations

import bisect
import math
import os
import platform
import re
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


# -- figures -------------------------------------------------------------------------------


def percentile(values: list[float], pct: float) -> float:
    """Nearest-rank percentile: a value that was actually observed."""
    ordered = sorted(values)
    index = max(0, math.ceil(pct / 100 * len(ordered)) - 1)
    return ordered[index]


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


def fresh_database(name: str) -> str:
    """Drop, create and migrate database `name` on the configured server, set
    Django up on it, and return its URL."""
    server_url = configured_database_url()
    url = with_database_name(server_url, name)
    print(f"database {name}: dropping, creating, migrating", flush=True)
    recreate_database(server_url, name)
    setup_django(url)
    return url


def setup_django(bench_url: str) -> None:
    os.environ["DATABASE_URL"] = bench_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpusched.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)
    call_command("loaddata", "tiers", "policy", verbosity=0)


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


# -- the claim's plan ----------------------------------------------------------------------


def mark_succeeded(job_id: int) -> None:
    sql_execute(
        "UPDATE queueapp_job SET status = 'succeeded', finished_at = now(), "
        "lease_expires_at = NULL WHERE id = %s",
        [job_id],
    )


def explain(statement: str) -> str:
    """EXPLAIN (ANALYZE, BUFFERS) of a captured query, rolled back (it locks rows)."""
    from django.db import connection, transaction

    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + statement)
            lines = [row[0] for row in cursor.fetchall()]
        transaction.set_rollback(True)
    return "\n".join(lines)


_bench_gpu: list[int] = []


def bench_gpu() -> int:
    """The id of the GPU the benchmarks' claims are for (LLAMA_SWAP_URL's
    first), registered once, so no claim timed pays for the registration."""
    if not _bench_gpu:
        from queueapp.services import gpu_configured

        _bench_gpu.append(gpu_configured().pk)
    return _bench_gpu[0]


def is_candidate_query(sql: str) -> bool:
    """The claim's one query that chooses among the queued jobs (`snapshot.heads_read`)."""
    return "rank_key DESC" in sql and "JOIN queueapp_tier" in sql


@dataclass
class PlanNode:
    depth: int  # column of the node's name in the text plan
    name: str  # "Sort", "Index Only Scan using job_queued_rank on queueapp_job", ...
    rows: int  # actual rows per loop; 0 when never executed
    line: str
    details: list[str] = field(default_factory=list)  # "Index Cond: ...", "Buffers: ..."


PLAN_NODE = re.compile(
    r"^(?P<indent>\s*(?:->\s+)?)(?P<name>\S.*?)\s+\(cost=[^)]*\)\s+"
    r"(?:\(actual time=\S+ rows=(?P<rows>\d+) loops=\d+\)|\(never executed\))"
)


def plan_nodes(plan: str) -> list[PlanNode]:
    """The nodes of a text EXPLAIN ANALYZE plan, in order (a node's children follow it)."""
    nodes: list[PlanNode] = []
    for line in plan.splitlines():
        match = PLAN_NODE.match(line)
        if match:
            nodes.append(
                PlanNode(
                    depth=len(match["indent"]),
                    name=match["name"],
                    rows=int(match["rows"] or 0),
                    line=line.strip(),
                )
            )
        elif nodes and line.startswith(" "):  # not "Planning:" or "Execution Time:"
            nodes[-1].details.append(line.strip())
    return nodes


@dataclass
class PlanCheck:
    """Whether the candidate query's plan is the expected one, and what was found."""

    ok: bool = True
    findings: list[str] = field(default_factory=list)


def check_candidate_plan(statement: str, plan: str) -> PlanCheck:
    """Both partial indexes read as index scans, and nothing sorts (or reads) the queue.

    The query takes at most LIMIT ids from each index, so a Sort of that many
    rows (for the IN list, say) costs nothing; a Sort fed more rows than all
    the LIMITs together is sorting the queue.
    """
    wanted = ("job_queued_rank", "job_queued_model_rank")
    candidate_rows = sum(int(limit) for limit in re.findall(r"\bLIMIT (\d+)", statement))
    nodes = plan_nodes(plan)
    check = PlanCheck()
    scans: dict[str, str] = {}
    problems = []
    for index, node in enumerate(nodes):
        scan = re.match(r"(Index Scan|Index Only Scan)(?: Backward)? using (\w+) on ", node.name)
        # The planner may also use a partial index to fetch the chosen ids
        # (Index Cond on id); only a scan that reads the index in rank order
        # chooses the candidates.
        by_id = any(
            detail.startswith("Index Cond:") and re.search(r"\bid = ", detail)
            for detail in node.details
        )
        if scan and not by_id:
            scans.setdefault(scan[2], scan[1])
        if re.fullmatch(r"(Incremental )?Sort", node.name):
            child = nodes[index + 1] if index + 1 < len(nodes) else None
            fed = child.rows if child and child.depth > node.depth else node.rows
            if fed > candidate_rows:
                problems.append(f"a Sort fed {fed:,} rows: `{node.line}`")
        if re.match(r"Seq Scan on queueapp_job\b", node.name):
            problems.append(f"a sequential scan of the jobs table: `{node.line}`")
    for name in wanted:
        if name in scans:
            check.findings.append(f"`{name}`: {scans[name]}, in rank order.")
        else:
            problems.insert(0, f"no Index Scan or Index Only Scan in rank order using `{name}`")
    if problems:
        check.ok = False
        check.findings.extend(f"NOT the expected plan: {problem}" for problem in problems)
    else:
        check.findings.append(
            f"No Sort fed more than {candidate_rows} rows (the LIMITs together), no sequential"
            " scan of the jobs table: the expected plan."
        )
    return check


def plan_excerpt(plan: str) -> str:
    """The plan's nodes, index conditions and sorts, its total buffers and its timing.

    Per-node buffer counts and the Memoize/aggregate bookkeeping are left out;
    the full plan goes into the doc when the check fails.
    """
    keep = ("Index Cond:", "Sort Key:", "Sort Method:", "Planning Time:", "Execution Time:")
    lines = plan.splitlines()
    out = []
    for number, line in enumerate(lines):
        stripped = line.strip()
        if (
            PLAN_NODE.match(line)
            or stripped.startswith(keep)
            or (number == 1 and stripped.startswith("Buffers:"))  # the root's: the total
        ):
            out.append(re.sub(r"  \(cost=[^)]*\)", "", line))
    return "\n".join(out)


# -- the dispatch gap ----------------------------------------------------------------------


@dataclass
class GapSplit:
    """Medians of where a gap goes, from the jobs' timestamps (`gap_breakdown`)."""

    name: str
    answer_to_finish: float
    finish_to_claim: float
    claim_to_request: float
    matched: int
    note: str = ""


def set_paused(paused: bool) -> float:
    """Pause or resume dispatch the way an operator does; returns the seconds it took."""
    from queueapp.services import policy_update

    start = time.perf_counter()
    policy_update(changes={"dispatch_paused": paused})
    return time.perf_counter() - start


def gaps_ms(entries: list[dict[str, Any]]) -> list[float]:
    """Idle time of the simulated GPU between consecutive requests."""
    ordered = sorted(entries, key=lambda entry: entry["seq"])
    return [
        (later["received_at"] - earlier["finished_at"]) * 1000
        for earlier, later in zip(ordered, ordered[1:], strict=False)
    ]


def gap_breakdown(
    name: str, rows: list[tuple[datetime, datetime]], entries: list[dict[str, Any]], note: str = ""
) -> GapSplit:
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
    if not answer_to_finish:  # shown as such in the doc; the gaps themselves still count
        return GapSplit(name, math.nan, math.nan, math.nan, matched=0, note=note)
    return GapSplit(
        name,
        percentile(answer_to_finish, 50),
        percentile(finish_to_claim, 50),
        percentile(claim_to_send, 50),
        matched=len(answer_to_finish),
        note=note,
    )


# -- output --------------------------------------------------------------------------------


def checks_table(checks: dict[str, str]) -> list[str]:
    """A markdown table of checks: each held ("ok") or the problem found."""
    return [
        "| Check | Held |",
        "|---|---|",
        *(
            f"| {name} | {'yes' if result == 'ok' else '**no**: ' + result} |"
            for name, result in checks.items()
        ),
    ]


def fmt_ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.1f}"


def write_between_markers(path: Path, start: str, end: str, *, heading: str, text: str) -> None:
    """Replace what lies between the markers; add `heading` and the markers at
    the end of the file when they are absent. The other scripts' sections are
    left as they are."""
    doc = path.read_text()
    if start not in doc or end not in doc:
        doc = doc.rstrip("\n") + f"\n\n{heading}\n\n{start}\n{end}\n"
    head, _, rest = doc.partition(start)
    _, _, tail = rest.partition(end)
    path.write_text(f"{head}{start}\n{text}{end}{tail}")
    print(f"wrote {path.relative_to(ROOT)}")
