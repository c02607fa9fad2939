#!/usr/bin/env python
"""Wait bounds: how soon a call the forecast cannot start in time is refused
(503 `gpu_busy`, nothing queued), beside calls the same process answers
anyway, in the same run.

On its own database (``gpusched_bench_wait_bound`` on the configured server:
the embedded PostgreSQL unless DATABASE_URL is set, recreated at every
start), with the built-in llama-swap simulator, a GPU cluster and Daphne as
separate processes. A holder's job keeps the one GPU busy (its model is
expected to run `--expected` seconds: learned run statistics are seeded),
`--ahead` jobs wait behind it, and then, `--calls` times each after a few
warm-ups, one `httpx` client makes, in turn:

- a front-door call with `X-Gpusched-Max-Wait: 5`: refused;
- a REST submission with the same header: refused;
- a REST submission without a bound: 201, its job then cancelled (the peer:
  what every submission pays, a forecast included);
- `GET /api/health/` (the web process's floor).

Reported: p50, p95 and max per kind, client to client; the goal is a
refusal answered within 50 ms at the median. Every refusal must carry
`Retry-After` and name the holder, and none may leave a job behind. Prints
the results and rewrites the wait-bound section of docs/benchmarks.md.

    .venv/bin/python benchmarks/wait_bound.py
    .venv/bin/python benchmarks/wait_bound.py --calls 20 --no-doc
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import harness  # benchmarks/harness.py: database set-up, machine description, percentile
import httpx

ROOT = Path(__file__).resolve().parent.parent
DATABASE = "gpusched_bench_wait_bound"
DOC_PATH = ROOT / "docs" / "benchmarks.md"
START, END = "<!-- wait-bound:start -->", "<!-- wait-bound:end -->"
MODEL = "chat"
BOUND = "5"
GOAL_MS = 50.0
WARM_UPS = 10
KINDS = ("front door, refused", "REST, refused", "REST 201 without a bound", "GET /api/health/")


def chat(**extra: object) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **extra}


def timed(client: httpx.Client, kind: str, token: str) -> tuple[float, httpx.Response]:
    """One call of `kind`, its client-to-client milliseconds and its answer."""
    auth = {"Authorization": f"Bearer {token}"}
    bound = {**auth, "X-Gpusched-Max-Wait": BOUND}
    started = time.perf_counter()
    if kind == KINDS[0]:
        response = client.post("/v1/chat/completions", json=chat(), headers=bound)
    elif kind == KINDS[1]:
        response = client.post(
            "/api/jobs/", json={"path": "/v1/chat/completions", "body": chat()}, headers=bound
        )
    elif kind == KINDS[2]:
        response = client.post(
            "/api/jobs/", json={"path": "/v1/chat/completions", "body": chat()}, headers=auth
        )
    else:
        response = client.get("/api/health/")
    return (time.perf_counter() - started) * 1000, response


def checked(kind: str, response: httpx.Response) -> str | None:
    """What is wrong with the answer, if anything."""
    if kind in KINDS[:2]:
        if response.status_code != 503:
            return f"{kind}: {response.status_code} {response.text[:200]}"
        text = response.text
        if "gpu_busy" not in text or "held by job" not in text:
            return f"{kind}: the refusal does not name the holder: {text[:200]}"
        if not response.headers.get("retry-after", "").isdigit():
            return f"{kind}: no Retry-After"
        return None
    expected = 201 if kind == KINDS[2] else 200
    if response.status_code != expected:
        return f"{kind}: {response.status_code} {response.text[:200]}"
    return None


def measure(web_url: str, token: str, calls: int) -> tuple[dict[str, list[float]], list[str]]:
    """Each kind `calls` times, in turn, after the warm-ups; the problems seen."""
    times: dict[str, list[float]] = {kind: [] for kind in KINDS}
    problems: list[str] = []
    with httpx.Client(base_url=web_url, timeout=30) as client:
        for round_number in range(WARM_UPS + calls):
            for kind in KINDS:
                ms, response = timed(client, kind, token)
                problem = checked(kind, response)
                if problem:
                    problems.append(problem)
                if kind == KINDS[2] and response.status_code == 201:
                    job = response.json()["id"]
                    client.delete(f"/api/jobs/{job}/", headers={"Authorization": f"Bearer {token}"})
                if round_number >= WARM_UPS:
                    times[kind].append(ms)
    return times, problems


def section(
    machine: dict[str, str], times: dict[str, list[float]], args: argparse.Namespace
) -> str:
    lines = [
        f"Measured {datetime.now(UTC):%Y-%m-%d %H:%M} UTC with `benchmarks/wait_bound.py` "
        f"(`make bench-wait-bound`): one GPU held by a job expected to run {args.expected:g} s, "
        f"{args.ahead} jobs queued ahead, `X-Gpusched-Max-Wait: {BOUND}`, {args.calls} calls "
        f"of each kind in turn after {WARM_UPS} warm-ups, from one `httpx` client to Daphne, "
        "client to client. The REST 201 and the health check are the peers in the same run.",
        "",
        "| call | p50 | p95 | max |",
        "|---|---|---|---|",
    ]
    for kind, values in times.items():
        lines.append(
            f"| {kind} | {harness.percentile(values, 50):.1f} ms | "
            f"{harness.percentile(values, 95):.1f} ms | {max(values):.1f} ms |"
        )
    refused = [harness.percentile(times[kind], 50) for kind in KINDS[:2]]
    verdict = "met" if max(refused) <= GOAL_MS else "not met"
    lines += [
        "",
        f"Goal: a refusal answered within {GOAL_MS:g} ms (p50): {verdict}. A refusal costs "
        "one submission and one forecast, rolled back: about what a 201 costs, whose answer "
        "carries the forecast's estimate.",
        "",
        *(f"- {key}: {value}" for key, value in machine.items()),
    ]
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--ahead", type=int, default=30, help="jobs queued behind the holder")
    parser.add_argument("--expected", type=float, default=100.0, help="the model's run time")
    parser.add_argument("--no-doc", dest="doc", action="store_false")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    database_url = harness.fresh_database(DATABASE)
    machine = harness.machine_info()
    for name in ("httpx", "httpcore"):
        logging.getLogger(name).setLevel(logging.WARNING)
    from django.db import connection

    from gpusched.stack import Stack, wait_for
    from queueapp.models import Job, JobStatus, RunStats, Tier
    from queueapp.services import member_create

    Tier.objects.all().update(max_queued_jobs=args.ahead + args.calls + WARM_UPS + 10)
    tier = Tier.objects.get(name="max")
    _, holder = member_create(name="holder", tier=tier)
    _, caller = member_create(name="caller", tier=tier)
    RunStats.objects.create(
        model=MODEL, path="/v1/chat/completions", warm_seconds=args.expected, warm_samples=10
    )
    connection.close()
    log_dir = Path(tempfile.mkdtemp(prefix="gpusched-bench-wait-bound-"))
    print(f"logs: {log_dir}", flush=True)
    with Stack(database_url=database_url, log_dir=log_dir) as stack:
        stack.start_simulator(models={MODEL: 0.02})
        stack.start_cluster()
        web = stack.start_web()
        auth = {"Authorization": f"Bearer {holder}"}
        with httpx.Client(base_url=web.url, timeout=30) as client:
            for n in range(args.ahead + 1):
                body = chat(sim={"seconds": 3600}) if n == 0 else chat()
                created = client.post(
                    "/api/jobs/", json={"path": "/v1/chat/completions", "body": body}, headers=auth
                )
                created.raise_for_status()
        wait_for(
            lambda: Job.objects.filter(status=JobStatus.RUNNING).exists(),
            message="the holder's job to run",
        )
        jobs_before = Job.objects.count()
        connection.close()
        times, problems = measure(web.url, caller, args.calls)
        # Each REST 201 was cancelled; no refusal left a job.
        left = Job.objects.count() - jobs_before - (WARM_UPS + args.calls)
        if left:
            problems.append(f"{left} jobs left behind by refusals")
    text = section(machine, times, args)
    print()
    print(text)
    for problem in problems[:10]:
        print(f"PROBLEM: {problem}", file=sys.stderr)
    if args.doc:
        harness.write_between_markers(
            DOC_PATH, START, END, heading="## Wait-bound refusal", text=text
        )
    met = not problems and all(harness.percentile(times[kind], 50) <= GOAL_MS for kind in KINDS[:2])
    return 0 if met else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
