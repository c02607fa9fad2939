#!/usr/bin/env python
"""Waiting streams: how soon a queued streaming call hears its first comment line,
and what the comments cost while many wait (queueapp/frontdoor/waiting.py).

On its own database (``gpusched_bench_waiting_streams`` on the configured
server: the embedded PostgreSQL unless DATABASE_URL is set, recreated at
every start), with the built-in llama-swap simulator, a GPU cluster and
Daphne as separate processes. A holder's streaming call keeps the GPU busy;
then, for each count in `--callers`, that many streaming chat calls arrive at
once (httpx, one asyncio process) and wait, each recording when every
comment line arrives, for `--hold` seconds; the holder hangs up, the GPU
frees, and every call must end with the simulator's data lines and
`[DONE]`. Reported: time from the call to its first comment (p50, p99, max;
the goal is under a second), the longest gap between two comments of one
call (goal: the interval, GPUSCHED_STREAM_COMMENT_SECONDS, within 0.1 s),
and the web process's CPU while the calls wait. The time from the call to its
job's submission (its admission) is shown beside the first comment's: a
burst of calls queues one after another on the front door's threads.
Prints the results and rewrites the waiting-streams section of
docs/benchmarks.md.

    .venv/bin/python benchmarks/waiting_streams.py
    .venv/bin/python benchmarks/waiting_streams.py --callers 1 50 --hold 6 --no-doc
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import harness  # benchmarks/harness.py: database set-up, machine description, percentile
import httpx

ROOT = Path(__file__).resolve().parent.parent
DATABASE = "gpusched_bench_waiting_streams"
DOC_PATH = ROOT / "docs" / "benchmarks.md"
START, END = "<!-- waiting-streams:start -->", "<!-- waiting-streams:end -->"
INTERVAL = 5.0  # GPUSCHED_STREAM_COMMENT_SECONDS, its default
FIRST_COMMENT_GOAL = 1.0
GAP_SLACK = 0.1  # the event loop's own delay
MODEL = "chat"


@dataclass
class Caller:
    started: float = 0.0
    started_wall: float = 0.0  # epoch seconds, to compare with the job's submission
    job_id: int = 0
    comments: list[float] = field(default_factory=list)  # seconds after the call
    body: bytes = b""
    status: int = 0

    @property
    def data(self) -> bytes:
        return self.body[self.body.find(b"data: ") :] if b"data: " in self.body else b""

    def ok(self) -> bool:
        events = [e for e in self.data.split(b"\n\n") if e]
        chunks = [json.loads(e.removeprefix(b"data: ")) for e in events[:-1]]
        return (
            self.status == 200
            and bool(self.comments)
            and events[-1:] == [b"data: [DONE]"]
            and all(c.get("object") == "chat.completion.chunk" for c in chunks)
        )

    def longest_gap(self) -> float:
        gaps = [b - a for a, b in zip(self.comments, self.comments[1:], strict=False)]
        return max(gaps, default=0.0)


def body(**extra: object) -> dict:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        **extra,
    }


async def call(client: httpx.AsyncClient, token: str, caller: Caller) -> None:
    caller.started, caller.started_wall = time.monotonic(), time.time()
    headers = {"Authorization": f"Bearer {token}"}
    async with client.stream("POST", "/v1/chat/completions", json=body(), headers=headers) as r:
        caller.status = r.status_code
        caller.job_id = int(r.headers.get("x-gpusched-job-id", 0))
        async for chunk in r.aiter_raw():
            if chunk.startswith(b": "):
                caller.comments += [time.monotonic() - caller.started] * chunk.count(b"\n\n")
            caller.body += chunk


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def round_of(
    web_url: str, pid: int, tokens: list[str], hold: float
) -> tuple[list[Caller], float]:
    """`len(tokens)` calls waiting behind a holder for `hold` seconds."""
    limits = httpx.Limits(max_connections=len(tokens) + 2)
    timeout = httpx.Timeout(120)
    async with httpx.AsyncClient(base_url=web_url, limits=limits, timeout=timeout) as client:
        holder_token, *caller_tokens = tokens
        async with client.stream(
            "POST",
            "/v1/chat/completions",
            json=body(sim={"seconds": 600}),
            headers={"Authorization": f"Bearer {holder_token}"},
        ) as holder:
            chunks = holder.aiter_raw()
            await anext(chunks)  # it runs: the GPU is held
            callers = [Caller() for _ in caller_tokens]
            tasks = [
                asyncio.ensure_future(call(client, t, c))
                for t, c in zip(caller_tokens, callers, strict=True)
            ]
            started = time.monotonic()
            while not all(c.comments for c in callers) and time.monotonic() - started < hold:
                await asyncio.sleep(0.05)
            cpu_from, at = cpu_seconds(pid), time.monotonic()
            await asyncio.sleep(max(0.0, hold - (at - started)))
            cpu = (cpu_seconds(pid) - cpu_from) / max(1e-9, time.monotonic() - at)
        await asyncio.gather(*tasks)
    return callers, cpu


def figures(callers: list[Caller], cpu: float, hold: float) -> dict:
    firsts = [c.comments[0] for c in callers if c.comments]
    queued = queued_after(callers)
    return {
        "queued_p50": harness.percentile(queued, 50),
        "queued_p99": harness.percentile(queued, 99),
        "callers": len(callers),
        "ok": sum(c.ok() for c in callers),
        "first_p50": harness.percentile(firsts, 50),
        "first_p99": harness.percentile(firsts, 99),
        "first_max": max(firsts, default=float("nan")),
        "longest_gap": max(c.longest_gap() for c in callers),
        "comments": sum(len(c.comments) for c in callers),
        "cpu": cpu,
        "hold": hold,
    }


def queued_after(callers: list[Caller]) -> list[float]:
    """Seconds from each call to its job's submission (the admission's
    commit, by the database's clock on this same host)."""
    from queueapp.models import Job

    submitted = dict(
        Job.objects.filter(pk__in=[c.job_id for c in callers]).values_list("pk", "submitted_at")
    )
    return [
        submitted[c.job_id].timestamp() - c.started_wall for c in callers if c.job_id in submitted
    ]


def section(machine: dict[str, str], rounds: list[dict]) -> str:
    lines = [
        f"Measured {datetime.now(UTC):%Y-%m-%d %H:%M} UTC with `benchmarks/waiting_streams.py` "
        f"(comment interval {INTERVAL:g} s). A holder's stream keeps the one GPU busy; the "
        "callers' streaming chat calls arrive at once and wait; then the holder hangs up and "
        "every call is served. 'Job queued': from the call to its job's "
        "submission (the admission's commit), part of the time to the first comment. The web "
        "process's CPU is its share of one core while the calls wait (after every call's first "
        "comment).",
        "",
        "| waiting calls | served with comments, then data and `[DONE]` | job queued p50 / p99 "
        "| first comment p50 / p99 / max | longest gap between two comments | comments "
        "| web CPU while waiting |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rounds:
        lines.append(
            f"| {r['callers']} | {r['ok']}/{r['callers']} | {r['queued_p50'] * 1000:.0f} / "
            f"{r['queued_p99'] * 1000:.0f} ms | {r['first_p50'] * 1000:.0f} / "
            f"{r['first_p99'] * 1000:.0f} / {r['first_max'] * 1000:.0f} ms | "
            f"{r['longest_gap']:.2f} s | {r['comments']} in {r['hold']:g} s | "
            f"{r['cpu'] * 100:.0f} % |"
        )
    lines += [
        "",
        f"Goals: first comment under {FIRST_COMMENT_GOAL:g} s; no gap over "
        f"{INTERVAL + GAP_SLACK:g} s.",
        "",
    ]
    lines += [f"- {key}: {value}" for key, value in machine.items()]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--callers", type=int, nargs="+", default=[1, 200])
    parser.add_argument("--hold", type=float, default=12.0, help="seconds the calls wait")
    parser.add_argument("--no-doc", dest="doc", action="store_false")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    database_url = harness.fresh_database(DATABASE)
    machine = harness.machine_info()
    for name in ("httpx", "httpcore"):
        logging.getLogger(name).setLevel(logging.WARNING)
    from django.db import connection

    from gpusched.stack import Stack
    from queueapp.models import Tier
    from queueapp.services import member_create

    most = max(args.callers)
    Tier.objects.all().update(max_queued_jobs=most + 10)
    tier = Tier.objects.get(name="max")
    tokens = [member_create(name=f"caller-{n}", tier=tier)[1] for n in range(most + 1)]
    connection.close()
    log_dir = Path(tempfile.mkdtemp(prefix="gpusched-bench-waiting-streams-"))
    print(f"logs: {log_dir}", flush=True)
    rounds = []
    with Stack(database_url=database_url, log_dir=log_dir) as stack:
        stack.start_simulator(models={MODEL: 0.02})
        stack.start_cluster()
        web = stack.start_web(GPUSCHED_STREAM_COMMENT_SECONDS=f"{INTERVAL:g}")
        assert web.process is not None
        for count in args.callers:
            print(f"{count} waiting calls", flush=True)
            callers, cpu = asyncio.run(
                round_of(web.url, web.process.pid, tokens[: count + 1], args.hold)
            )
            result = figures(callers, cpu, args.hold)
            print(f"  {result}", flush=True)
            rounds.append(result)
    text = section(machine, rounds)
    print()
    print(text)
    if args.doc:
        harness.write_between_markers(DOC_PATH, START, END, heading="## Waiting streams", text=text)
    met = all(
        r["ok"] == r["callers"]
        and r["first_max"] < FIRST_COMMENT_GOAL
        and r["longest_gap"] <= INTERVAL + GAP_SLACK
        for r in rounds
    )
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
