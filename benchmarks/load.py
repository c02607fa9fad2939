#!/usr/bin/env python
"""Load: many submissions from concurrent clients against a real web server.

Starts daphne as `make run` does, on its own database (``gpusched_load`` on
the configured server: the embedded PostgreSQL unless DATABASE_URL is set,
recreated at every start), and lets `--clients` concurrent clients (asyncio,
each with its own httpx connection pool) submit `--submissions` jobs through
`POST /api/jobs/`, each with a distinct label in its body. Then checks that
every label was recorded exactly once under the id its 201 answer gave, that
no answer was a 5xx, and that the queue's invariants hold
(queueapp/integrity.py); then a GPU cluster dispatches every job to an
in-process simulator that answers at once, and the run checks that each job
ran exactly once. Prints a table and rewrites the load section of
docs/benchmarks.md and the figures in docs/reliability.md.

    .venv/bin/python benchmarks/load.py                       # make load
    .venv/bin/python benchmarks/load.py --submissions 300 --clients 10 --no-doc
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import harness  # benchmarks/harness.py: database set-up, machine description, percentile
import httpx

from gpusched.stack import Stack, wait_for

ROOT = Path(__file__).resolve().parent.parent
DATABASE = "gpusched_load"
BENCH_DOC = ROOT / "docs" / "benchmarks.md"
RELIABILITY_DOC = ROOT / "docs" / "reliability.md"
START, END = "<!-- load:start -->", "<!-- load:end -->"
RATE_GOAL = 300.0  # sustained submissions per second
MODELS = ("chat-small", "image-xl", "video-wan")
# The three named bands and a few explicit priorities, as clients send them.
PRIORITIES = ("interactive", "normal", "batch", "normal", "batch", "50", "-20")
DRAIN_TIMEOUT = 600.0
DEFAULT_POOL = 20


@dataclass
class Answer:
    label: str
    status: int
    seconds: float
    job_id: int | None
    started: float
    error: str = ""


@dataclass
class Outcome:
    answers: list[Answer]
    wall_seconds: float
    checks: dict[str, str] = field(default_factory=dict)  # name -> "ok" or the problem
    drain_seconds: float | None = None
    baseline: tuple[float, float] | None = None  # GET /api/health/: per second, p50 ms

    @property
    def ok(self) -> bool:
        return all(result == "ok" for result in self.checks.values())


def job_request(label: str, index: int) -> tuple[dict[str, Any], dict[str, str]]:
    model = MODELS[index % len(MODELS)]
    body = {"model": model, "messages": [{"role": "user", "content": f"load {label}"}]}
    body["user"] = label  # the simulator logs it; the checks look it up
    priority = PRIORITIES[index % len(PRIORITIES)]
    return {"path": "/v1/chat/completions", "body": body}, {"X-LlamaSwap-Priority": priority}


async def client(
    url: str, token: str, labels: list[tuple[int, str]], answers: list[Answer]
) -> None:
    """One client: its own connection pool (one connection), one request at a time."""
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, limits=limits, timeout=60) as http:
        for index, label in labels:
            payload, extra = job_request(label, index)
            start = time.perf_counter()
            try:
                response = await http.post("/api/jobs/", json=payload, headers=extra)
            except httpx.HTTPError as exc:
                seconds = time.perf_counter() - start
                answers.append(Answer(label, 0, seconds, None, start, repr(exc)))
                continue
            seconds = time.perf_counter() - start
            job_id = response.json().get("id") if response.status_code == 201 else None
            error = "" if response.status_code == 201 else response.text[:300]
            answers.append(Answer(label, response.status_code, seconds, job_id, start, error))


async def submit_all(url: str, tokens: list[str], submissions: int, clients: int) -> Outcome:
    labels = [(index, f"load-{index:05d}") for index in range(submissions)]
    answers: list[Answer] = []
    # Client c submits every clients-th label; client c uses member c % members.
    start = time.perf_counter()
    await asyncio.gather(
        *(client(url, tokens[c % len(tokens)], labels[c::clients], answers) for c in range(clients))
    )
    return Outcome(answers, time.perf_counter() - start)


async def baseline(url: str, requests: int, clients: int) -> tuple[float, float]:
    """`GET /api/health/` (no auth, a few reads) from the same clients: what the
    server stack itself sustains here; returns (per second, p50 ms)."""
    seconds: list[float] = []

    async def one(count: int) -> None:
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as http:
            for _ in range(count):
                start = time.perf_counter()
                response = await http.get("/api/health/")
                seconds.append(time.perf_counter() - start)
                response.raise_for_status()

    start = time.perf_counter()
    await asyncio.gather(*(one(requests // clients) for _ in range(clients)))
    wall = time.perf_counter() - start
    return len(seconds) / wall, harness.percentile([s * 1000 for s in seconds], 50)


def check_recorded(outcome: Outcome) -> None:
    """Every label once in the database, under the id its 201 gave; no 5xx."""
    from django.db.models import Count

    from queueapp.models import Job

    answers = outcome.answers
    statuses = Counter(answer.status for answer in answers)
    server_errors = [a for a in answers if a.status >= 500 or a.status == 0]
    outcome.checks["no 5xx (or broken connection)"] = (
        "ok"
        if not server_errors
        else f"{len(server_errors)}: {server_errors[0].status} {server_errors[0].error}"
    )
    outcome.checks["every answer 201"] = "ok" if set(statuses) == {201} else str(dict(statuses))
    rows = set(Job.objects.values_list("body__user", "id"))
    recorded = Counter(label for label, _ in rows)
    duplicates = {label: n for label, n in recorded.items() if n > 1}
    # Lost: acknowledged with a 201 but not in the table. A refused submission
    # must not be there either (a client would retry it: a duplicate).
    missing = [a.label for a in answers if a.status == 201 and a.label not in recorded]
    refused_but_kept = [a.label for a in answers if a.status != 201 and a.label in recorded]
    wrong_id = [
        a.label for a in answers if a.job_id is not None and (a.label, a.job_id) not in rows
    ]
    extra = set(recorded) - {a.label for a in answers}
    problems = []
    if duplicates:
        problems.append(f"{len(duplicates)} recorded twice or more, e.g. {next(iter(duplicates))}")
    if missing:
        problems.append(f"{len(missing)} acknowledged but missing, e.g. {missing[0]}")
    if refused_but_kept:
        problems.append(f"{len(refused_but_kept)} refused but recorded, e.g. {refused_but_kept[0]}")
    if wrong_id:
        problems.append(f"{len(wrong_id)} under another id than answered, e.g. {wrong_id[0]}")
    if extra:
        problems.append(f"{len(extra)} recorded that nobody submitted")
    accepted = sum(a.status == 201 for a in answers)
    if accepted != Job.objects.count():
        problems.append(f"{Job.objects.count()} jobs for {accepted} accepted submissions")
    outcome.checks["recorded exactly once"] = "ok" if not problems else "; ".join(problems)
    counts = Job.objects.values("status").annotate(n=Count("id"))
    print(f"  jobs by status: { ({row['status']: row['n'] for row in counts}) }", flush=True)


def check_queue(outcome: Outcome, url: str, staff_token: str) -> None:
    from queueapp.integrity import queue_lines_violations, queue_order_violations

    lines = queue_lines_violations()
    outcome.checks["one head per queue line, keys current"] = (
        "ok" if not lines else f"{len(lines)}: {lines[0]}"
    )
    response = httpx.get(
        f"{url}/api/queue/", headers={"Authorization": f"Bearer {staff_token}"}, timeout=60
    )
    if response.status_code != 200:
        outcome.checks["queue view order"] = f"GET /api/queue/ answered {response.status_code}"
        return
    order = queue_order_violations(response.json())
    outcome.checks["queue view order"] = "ok" if not order else f"{len(order)}: {order[0]}"


def drain(outcome: Outcome, database_url: str) -> None:
    """Dispatch every job through a real cluster; each must run exactly once."""
    from django.db.models import Count

    from queueapp.models import DispatchDecision, Job, JobStatus
    from queueapp.services import policy_update
    from queueapp.upstream.simulator import LlamaSwapSimulator

    simulator = LlamaSwapSimulator(default_seconds=0, swap_seconds=0, accept_any_model=True)
    simulator.start()
    log_dir = Path(tempfile.mkdtemp(prefix="gpusched-load-cluster-"))
    stack = Stack(database_url=database_url, log_dir=log_dir, upstream_url=simulator.url)
    total = len(outcome.answers)
    try:
        cluster = stack.start_cluster()
        start = time.perf_counter()
        policy_update(changes={"dispatch_paused": False})

        def done() -> bool:
            cluster.check_alive()
            return not Job.objects.filter(status__in=[JobStatus.QUEUED, JobStatus.RUNNING]).exists()

        wait_for(done, timeout=DRAIN_TIMEOUT, message="every job dispatched", interval=0.5)
        outcome.drain_seconds = time.perf_counter() - start
    finally:
        stack.stop()
        simulator.stop()
    served = Counter(entry["body"]["user"] for entry in simulator.log())
    twice = {label: n for label, n in served.items() if n > 1}
    not_run = total - len(served)
    decisions = (
        DispatchDecision.objects.values("job").annotate(n=Count("id")).filter(n__gt=1).count()
    )
    statuses = Counter(Job.objects.values_list("status", flat=True))
    attempts = Job.objects.filter(attempts__gt=1).count()
    problems = []
    if twice:
        problems.append(f"{len(twice)} sent to llama-swap more than once")
    if not_run:
        problems.append(f"{not_run} never sent")
    if decisions:
        problems.append(f"{decisions} jobs with more than one dispatch decision")
    if attempts:
        problems.append(f"{attempts} jobs started more than once")
    if statuses != Counter({JobStatus.SUCCEEDED: total}):
        problems.append(f"statuses {dict(statuses)}")
    outcome.checks["each job ran exactly once"] = "ok" if not problems else "; ".join(problems)


@dataclass
class Figures:
    rate: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    max_ms: float


def figures(outcome: Outcome) -> Figures:
    ms = [answer.seconds * 1000 for answer in outcome.answers]
    return Figures(
        rate=len(outcome.answers) / outcome.wall_seconds,
        p50_ms=harness.percentile(ms, 50),
        p95_ms=harness.percentile(ms, 95),
        p99_ms=harness.percentile(ms, 99),
        max_ms=max(ms),
    )


def section(args: argparse.Namespace, machine: dict[str, str], outcome: Outcome) -> str:
    f = figures(outcome)
    met = f.rate >= RATE_GOAL
    stack = (
        " For comparison, `GET /api/health/` (no token, four small reads), measured first on"
        f" the empty queue from the same clients:"
        f" {outcome.baseline[0]:.0f} per second, p50 {outcome.baseline[1]:.1f} ms."
        if outcome.baseline is not None
        else ""
    )
    drained = (
        f" The cluster then dispatched all {len(outcome.answers):,} jobs in"
        f" {outcome.drain_seconds:.1f} s."
        if outcome.drain_seconds is not None
        else ""
    )
    return "\n".join(
        [
            f"Run on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {machine['CPU cores (nproc)']} cores"
            f" (nproc; {machine['CPU model']}), load average at start"
            f" {machine['Load average at start (1/5/15 min)']}:",
            "",
            "```sh",
            f".venv/bin/python benchmarks/load.py --submissions {args.submissions}"
            f" --clients {args.clients} --members {args.members} --pool {args.pool}",
            "```",
            "",
            "| Submissions | Clients | Members | Wall s | Per second | p50 ms | p95 ms"
            " | p99 ms | max ms |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
            f"| {len(outcome.answers):,} | {args.clients} | {args.members}"
            f" | {outcome.wall_seconds:.2f} | {f.rate:.0f} | {f.p50_ms:.1f} | {f.p95_ms:.1f}"
            f" | {f.p99_ms:.1f} | {f.max_ms:.1f} |",
            "",
            f"Goal, at least {RATE_GOAL:.0f} submissions per second sustained:"
            f" {'met' if met else '**not met**'}.{stack}{drained}",
            "",
            *harness.checks_table(outcome.checks),
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--submissions", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument(
        "--members", type=int, default=10, help="clients share members (default 10)"
    )
    parser.add_argument(
        "--pool",
        type=int,
        default=int(os.environ.get("GPUSCHED_DB_POOL") or DEFAULT_POOL),
        help=f"the web server's database connections (GPUSCHED_DB_POOL; default {DEFAULT_POOL},"
        " as make run; 0: one per request)",
    )
    parser.add_argument(
        "--no-baseline",
        dest="baseline",
        action="store_false",
        help="skip measuring GET /api/health/ first",
    )
    parser.add_argument(
        "--no-dispatch", dest="dispatch", action="store_false", help="skip the cluster run"
    )
    parser.add_argument("--no-doc", dest="doc", action="store_false", help="leave the docs alone")
    args = parser.parse_args(argv)

    database_url = harness.fresh_database(DATABASE)
    from django.db import connection

    from queueapp.models import Tier
    from queueapp.services import member_create, policy_update

    tiers = list(Tier.objects.order_by("bonus", "name"))
    # Room for every submission: the limit is not what this measures.
    Tier.objects.update(max_queued_jobs=args.submissions)
    tokens = [
        member_create(name=f"load-{n:02d}", tier=tiers[n % len(tiers)])[1]
        for n in range(args.members)
    ]
    _, staff_token = member_create(name="load-staff", tier=tiers[0], is_staff=True)
    # Submissions still wake the dispatcher (an ORM-broker task), as in
    # production; the cluster starts only after the checks, on a still queue.
    policy_update(changes={"dispatch_paused": True})
    connection.close()
    machine = harness.machine_info()
    logging.getLogger("httpx").setLevel(logging.WARNING)
    stack = Stack(
        database_url=database_url, log_dir=Path(tempfile.mkdtemp(prefix="gpusched-load-"))
    )
    print(f"starting daphne (logs: {stack.log_dir})", flush=True)
    try:
        url = stack.start_web(GPUSCHED_DB_POOL=str(args.pool)).url
        health = None
        if args.baseline:
            health = asyncio.run(baseline(url, args.submissions, args.clients))
            print(f"  GET /api/health/: {health[0]:.0f} per second, p50 {health[1]:.1f} ms")
        print(f"{args.submissions:,} submissions from {args.clients} clients", flush=True)
        outcome = asyncio.run(submit_all(url, tokens, args.submissions, args.clients))
        outcome.baseline = health
        f = figures(outcome)
        print(
            f"  {f.rate:.0f} per second; p50 {f.p50_ms:.1f} ms, p99 {f.p99_ms:.1f} ms",
            flush=True,
        )
        check_recorded(outcome)
        check_queue(outcome, url, staff_token)
    finally:
        stack.stop()
    if args.dispatch:
        print("dispatching every job through a GPU cluster", flush=True)
        drain(outcome, database_url)
    text = section(args, machine, outcome)
    print()
    print(text)
    if args.doc:
        harness.write_between_markers(BENCH_DOC, START, END, heading="## Load", text=text)
    return 0 if outcome.ok else 1


if __name__ == "__main__":
    sys.exit(main())
