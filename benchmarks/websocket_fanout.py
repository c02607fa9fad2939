#!/usr/bin/env python
"""Benchmark of the live dashboard: how fast one queue change reaches many viewers.

A daphne server on its own database (``gpusched_fanout``, recreated at every
start), `--clients` viewers of `/ws/queue/`, one job submitted at a time over
HTTP. Prints a Markdown table and rewrites the fan-out section of
docs/benchmarks.md.

    .venv/bin/python benchmarks/websocket_fanout.py --clients 200
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import harness  # benchmarks/harness.py: its database set-up, machine description, percentile
import httpx
from websockets.asyncio.client import ClientConnection, connect
from websockets.typing import Origin

from gpusched.stack import Stack

ROOT = Path(__file__).resolve().parent.parent
DATABASE = "gpusched_fanout"
DOC_PATH = ROOT / "docs" / "benchmarks.md"
START, END = "<!-- fanout:start -->", "<!-- fanout:end -->"
GOAL_SECONDS = 1.0
ROUND_TIMEOUT = 10.0  # seconds; a viewer without the update by then counts as "never"
BACKLOG_MEMBERS = 10
JOB: dict[str, Any] = {"path": "/v1/chat/completions", "body": {"model": "m", "messages": []}}


@dataclass
class Viewer:
    socket: ClientConnection
    connect_s: float
    # Messages of the current round, stamped on receipt and parsed only after
    # the round: parsing 200 large messages here would delay the later stamps.
    inbox: list[tuple[float, str]] = field(default_factory=list)


@dataclass
class Round:
    scenario: str
    post_s: float  # POST /api/jobs/ until its 201
    latencies: list[float]  # t0 -> update listing the job, per viewer (inf: never)

    def within_goal(self) -> int:
        return sum(latency <= GOAL_SECONDS for latency in self.latencies)


async def open_viewer(ws_url: str, origin: str, token: str) -> Viewer:
    """Connect, authenticate, read the snapshot; times all three."""
    start = time.perf_counter()
    ws = await connect(ws_url, origin=Origin(origin), open_timeout=60, max_size=None)
    if json.loads(await ws.recv()).get("type") != "auth_required":
        raise RuntimeError("expected auth_required")
    await ws.send(json.dumps({"type": "auth", "token": token}))
    # An update may overtake the snapshot while the hub starts; wait for the snapshot.
    while (message := json.loads(await ws.recv())).get("type") != "snapshot":
        if message.get("type") == "error":
            raise RuntimeError(f"refused: {message}")
    return Viewer(ws, time.perf_counter() - start)


async def follow(viewer: Viewer) -> None:
    async for message in viewer.socket:
        viewer.inbox.append((time.perf_counter(), str(message)))


async def quiet(viewers: list[Viewer], seconds: float = 1.0, timeout: float = 60.0) -> None:
    """Wait until no viewer has received anything for `seconds` (the hub is idle),
    dropping what arrives meanwhile."""
    start = since = time.perf_counter()
    while time.perf_counter() - since < seconds and time.perf_counter() < start + timeout:
        await asyncio.sleep(0.05)
        if any(viewer.inbox for viewer in viewers):
            since = time.perf_counter()
            for viewer in viewers:
                viewer.inbox.clear()


async def one_round(scenario: str, http: httpx.AsyncClient, viewers: list[Viewer]) -> Round:
    await quiet(viewers)  # one change at a time, on an idle server
    t0 = time.perf_counter()
    response = await http.post("/api/jobs/", json=JOB)
    post_s = time.perf_counter() - t0
    if response.status_code != 201:
        raise RuntimeError(f"submission refused: {response.status_code} {response.text}")
    job_id = response.json()["id"]
    # A cheap text match while waiting; the JSON check follows after the round.
    needle = f'"id": {job_id},'
    found: dict[int, tuple[float, str]] = {}
    scanned = [0] * len(viewers)
    while len(found) < len(viewers) and time.perf_counter() < t0 + ROUND_TIMEOUT:
        await asyncio.sleep(0.005)
        for index, viewer in enumerate(viewers):
            while index not in found and scanned[index] < len(viewer.inbox):
                at, message = viewer.inbox[scanned[index]]
                scanned[index] += 1
                if needle in message:
                    found[index] = (at, message)
    for _, message in found.values():
        data = json.loads(message)
        state = data["changes"] if data["type"] == "delta" else data
        if job_id not in {entry["id"] for entry in state.get("queued") or []}:
            raise RuntimeError(f"an update matched job {job_id} without listing it")
    latencies = [found[i][0] - t0 if i in found else math.inf for i in range(len(viewers))]
    return Round(scenario, post_s, latencies)


def seed_backlog(jobs: int) -> None:
    """Other members' queued jobs, which every viewer sees redacted."""
    from django.db import connection

    from queueapp.models import Tier
    from queueapp.services import job_submit, member_create

    tier = Tier.objects.order_by("bonus")[0]
    members = [member_create(name=f"fanout-{n}", tier=tier)[0] for n in range(BACKLOG_MEMBERS)]
    for n in range(jobs):
        job_submit(member=members[n % len(members)], model="m", priority_header=None, **JOB)
    connection.close()  # this runs in a worker thread, whose connection nobody else closes


Measured = tuple[list[float], float, list[Round]]  # connect times, connecting all, rounds


async def measure(url: str, token: str, args: argparse.Namespace) -> Measured:
    ws_url = url.replace("http://", "ws://") + "/ws/queue/"
    start = time.perf_counter()
    viewers = await asyncio.gather(*(open_viewer(ws_url, url, token) for _ in range(args.clients)))
    connect_all_s = time.perf_counter() - start
    readers = [asyncio.create_task(follow(viewer)) for viewer in viewers]
    rounds = []
    try:
        headers = {"Authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as http:
            for scenario, backlog in (("empty queue", 0), (f"{args.backlog} queued", args.backlog)):
                if backlog:
                    await asyncio.to_thread(seed_backlog, backlog)
                for _ in range(args.rounds):
                    rounds.append(await one_round(scenario, http, viewers))
                    print(f"  {row(rounds[-1])}", flush=True)
    finally:
        for reader in readers:
            reader.cancel()
        await asyncio.gather(*(viewer.socket.close() for viewer in viewers), return_exceptions=True)
    return [v.connect_s for v in viewers], connect_all_s, rounds


def ms(seconds: float) -> str:
    return "never" if math.isinf(seconds) else f"{seconds * 1000:.0f}"


def row(r: Round, name: str = "") -> str:
    lat = r.latencies
    return (
        f"| {name or r.scenario} | {ms(r.post_s)} | {ms(min(lat))} "
        f"| {ms(harness.percentile(lat, 50))} "
        f"| {ms(harness.percentile(lat, 95))} | {ms(max(lat))} | {r.within_goal()}/{len(lat)} |"
    )


def section(args: argparse.Namespace, machine: dict[str, str], measured: Measured) -> str:
    connects, connect_all_s, rounds = measured
    n = args.clients
    worst = [max(rounds, key=lambda r: max(r.latencies))]
    met = all(r.within_goal() == n for r in rounds)
    return "\n".join(
        [
            f"One queue change pushed to {n} viewers of `/ws/queue/`: {n} asyncio clients (one"
            " process, one member's token) connect to a daphne server on its own database"
            f" `{DATABASE}`; then a job is submitted (`POST /api/jobs/`), which reaches the hub by"
            " PostgreSQL `NOTIFY`. Latency: from just before the POST until the viewer receives"
            " the delta listing the job (a merge patch of the parts that changed). One"
            " submission at a time, on an idle server,"
            f" {args.rounds} with an empty queue, then {args.rounds} with {args.backlog} jobs of"
            f" other members queued (each viewer's state then lists the head of the queue,"
            " `LIVE_QUEUE_HEAD` jobs, redacted, and the viewer's own further back). Clients,"
            " server and database share the machine's cores.",
            "",
            f"Run on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {machine['CPU cores (nproc)']} cores"
            f" (nproc; {machine['CPU model']}), load average at start"
            f" {machine['Load average at start (1/5/15 min)']}:",
            "",
            "```sh",
            f".venv/bin/python benchmarks/websocket_fanout.py --clients {n} --rounds"
            f" {args.rounds} --backlog {args.backlog}",
            "```",
            "",
            f"Connecting (empty queue): all {n} viewers had their snapshot after"
            f" {connect_all_s:.2f} s; per viewer p50 {ms(harness.percentile(connects, 50))} ms,"
            f" p95 {ms(harness.percentile(connects, 95))} ms, max {ms(max(connects))} ms.",
            "",
            "| Queue | POST ms | first ms | p50 ms | p95 ms | max ms | within 1 s |",
            "|---|---:|---:|---:|---:|---:|---:|",
            *(row(r) for r in rounds),
            *(row(r, f"**worst** ({r.scenario})") for r in worst),
            "",
            f"Goal, all {n} viewers within {GOAL_SECONDS:g} s in every round:"
            f" {'met' if met else '**not met**'}.",
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=200, help="viewers (default 200)")
    parser.add_argument("--rounds", type=int, default=5, help="submissions per queue state")
    parser.add_argument("--backlog", type=int, default=250, help="jobs queued for the second part")
    parser.add_argument("--no-doc", dest="doc", action="store_false", help="leave the doc alone")
    args = parser.parse_args(argv)

    database_url = harness.fresh_database(DATABASE)
    from queueapp.models import Tier
    from queueapp.services import member_create

    _, token = member_create(name="fanout-viewer", tier=Tier.objects.order_by("bonus")[0])
    machine = harness.machine_info()
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise
    logging.getLogger("django-q").setLevel(logging.WARNING)  # each submission's wake-up
    log_dir = Path(tempfile.mkdtemp(prefix="gpusched-fanout-"))
    print(f"starting daphne (logs: {log_dir})", flush=True)
    with Stack(database_url=database_url, log_dir=log_dir) as stack:
        url = stack.start_web().url
        print(f"{args.clients} viewers connecting, then {args.rounds} submissions", flush=True)
        measured = asyncio.run(measure(url, token, args))
    text = section(args, machine, measured)
    print()
    print(text)
    if args.doc:
        harness.write_between_markers(
            DOC_PATH, START, END, heading="## WebSocket fan-out", text=text
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
