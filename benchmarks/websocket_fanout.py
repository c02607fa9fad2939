#!/usr/bin/env python
"""Benchmark of the live dashboard: how fast one queue change reaches many viewers.

Starts a daphne server on its own database (``gpusched_fanout``, recreated at
every start), opens `--clients` WebSocket viewers on `/ws/queue/`, submits a
job over HTTP and times, per viewer, until an update listing the job arrives.
Prints a Markdown table and rewrites the fan-out section of docs/benchmarks.md.

    .venv/bin/python benchmarks/websocket_fanout.py --clients 200
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import httpx
from run import (  # the database set-up and machine description of benchmarks/run.py
    configured_database_url,
    machine_info,
    percentile,
    recreate_database,
    setup_django,
    wait_for,
    with_database_name,
)
from websockets.asyncio.client import ClientConnection, connect

ROOT = Path(__file__).resolve().parent.parent
DATABASE = "gpusched_fanout"
DOC_PATH = ROOT / "docs" / "benchmarks.md"
START, END = "<!-- fanout:start -->", "<!-- fanout:end -->"
GOAL_SECONDS = 1.0
BACKLOG_MEMBERS = 10
JOB = {"path": "/v1/chat/completions", "body": {"model": "m", "messages": []}}


@dataclass
class Viewer:
    socket: ClientConnection
    connect_s: float
    seen: dict[int, float] = field(default_factory=dict)  # job id -> first update listing it


@dataclass
class Round:
    post_s: float  # POST /api/jobs/ until its 201
    latencies: list[float]  # t0 -> update listing the job, per viewer (inf: never)

    def within_goal(self) -> int:
        return sum(latency <= GOAL_SECONDS for latency in self.latencies)


async def open_viewer(ws_url: str, origin: str, token: str) -> Viewer:
    """Connect, authenticate, read the snapshot; times all three."""
    start = time.perf_counter()
    socket = await connect(ws_url, origin=origin, open_timeout=60, max_size=None)  # type: ignore[arg-type]
    hello = json.loads(await socket.recv())
    if hello.get("type") != "auth_required":
        raise RuntimeError(f"expected auth_required, got {hello.get('type')}")
    await socket.send(json.dumps({"type": "auth", "token": token}))
    # An update may overtake the snapshot while the hub starts; wait for the snapshot.
    while (message := json.loads(await socket.recv())).get("type") != "snapshot":
        if message.get("type") == "error":
            raise RuntimeError(f"refused: {message}")
    return Viewer(socket, time.perf_counter() - start)


async def follow(viewer: Viewer) -> None:
    async for message in viewer.socket:
        # Stamped before parsing, so decoding in this process is not counted.
        at = time.perf_counter()
        for entry in json.loads(message).get("queued", []):
            viewer.seen.setdefault(entry["id"], at)


async def measure(
    url: str, token: str, args: argparse.Namespace
) -> tuple[list[float], float, list[Round]]:
    ws_url = url.replace("http://", "ws://") + "/ws/queue/"
    start = time.perf_counter()
    viewers = await asyncio.gather(*(open_viewer(ws_url, url, token) for _ in range(args.clients)))
    connect_all_s = time.perf_counter() - start
    readers = [asyncio.create_task(follow(viewer)) for viewer in viewers]
    rounds = []
    try:
        headers = {"Authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as http:
            for _ in range(args.rounds):
                await asyncio.sleep(0.5)  # let the previous round's traffic settle
                t0 = time.perf_counter()
                response = await http.post("/api/jobs/", json=JOB)
                post_s = time.perf_counter() - t0
                if response.status_code != 201:
                    raise RuntimeError(
                        f"submission refused: {response.status_code} {response.text}"
                    )
                job_id = response.json()["id"]
                deadline = t0 + args.timeout
                while time.perf_counter() < deadline and not all(job_id in v.seen for v in viewers):
                    await asyncio.sleep(0.002)
                latencies = [v.seen.get(job_id, math.inf) - t0 for v in viewers]
                rounds.append(Round(post_s, latencies))
                print(f"  round {len(rounds)}: {row(rounds[-1], str(len(rounds)))}", flush=True)
    finally:
        for reader in readers:
            reader.cancel()
        await asyncio.gather(*(viewer.socket.close() for viewer in viewers), return_exceptions=True)
    return [v.connect_s for v in viewers], connect_all_s, rounds


def ms(seconds: float) -> str:
    return "never" if math.isinf(seconds) else f"{seconds * 1000:.0f}"


def row(r: Round, name: str) -> str:
    lat = r.latencies
    return (
        f"| {name} | {ms(r.post_s)} | {ms(min(lat))} | {ms(percentile(lat, 50))} "
        f"| {ms(percentile(lat, 95))} | {ms(max(lat))} | {r.within_goal()}/{len(lat)} |"
    )


def start_server(database_url: str, log_path: Path) -> tuple[subprocess.Popen, str]:
    with socket.socket() as probe:  # a free port; daphne binds it right after
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = dict(os.environ, DATABASE_URL=database_url, PYTHONUNBUFFERED="1")
    argv = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port)]
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            [*argv, "gpusched.asgi:application"], cwd=ROOT, env=env, stdout=log, stderr=log
        )
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"daphne exited; see {log_path}")
        try:
            return httpx.get(f"{url}/api/health/", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    wait_for(healthy, timeout=30, what="the web server", interval=0.1)
    return process, url


def stop_server(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def section(
    args: argparse.Namespace,
    machine: dict[str, str],
    connects: list[float],
    connect_all_s: float,
    rounds: list[Round],
) -> str:
    worst = max(rounds, key=lambda r: (max(r.latencies), -r.within_goal()))
    met = all(r.within_goal() == args.clients for r in rounds)
    verdict = "met" if met else "**not met**"
    return "\n".join(
        [
            f"One queue change, pushed to {args.clients} viewers of `/ws/queue/` at once. A daphne"
            " server (one process, as `make run` starts it) serves its own database"
            f" `{DATABASE}`; {args.clients} asyncio clients connect, authenticate with a member's"
            f" token and read their snapshot. Then, {args.rounds} times, one job is submitted over"
            " HTTP"
            " (`POST /api/jobs/`), which reaches the server's hub by PostgreSQL `NOTIFY`; each"
            " viewer's latency runs from just before the POST until an update listing the job"
            " arrives (stamped on receipt, before the client parses it). The clients run in one"
            " process on the same machine, so they share its cores with the server and the"
            " database.",
            "",
            f"Run on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC on {machine['CPU cores (nproc)']} cores"
            f" (nproc; {machine['CPU model']}, load average at start"
            f" {machine['Load average at start (1/5/15 min)']}):",
            "",
            "```sh",
            ".venv/bin/python benchmarks/websocket_fanout.py"
            f" --clients {args.clients} --rounds {args.rounds}",
            "```",
            "",
            f"Connecting: all {args.clients} viewers connected, authenticated and had their"
            f" snapshot after {connect_all_s:.2f} s; per viewer"
            f" p50 {ms(percentile(connects, 50))} ms, p95 {ms(percentile(connects, 95))} ms, max {ms(max(connects))} ms.",
            "",
            "| Round | POST ms | first ms | p50 ms | p95 ms | max ms | within 1 s |",
            "|---|---:|---:|---:|---:|---:|---:|",
            *(row(r, str(n)) for n, r in enumerate(rounds, 1)),
            row(worst, "**worst**"),
            "",
            f"Goal, every viewer within {GOAL_SECONDS:g} s in every round: {verdict}.",
            "",
        ]
    )


def write_doc(text: str) -> None:
    doc = DOC_PATH.read_text()
    if START not in doc or END not in doc:
        doc = doc.rstrip("\n") + f"\n\n## WebSocket fan-out\n\n{START}\n{END}\n"
    head, _, rest = doc.partition(START)
    _, _, tail = rest.partition(END)
    DOC_PATH.write_text(f"{head}{START}\n{text}{END}{tail}")
    print(f"wrote {DOC_PATH.relative_to(ROOT)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=200, help="viewers (default 200)")
    parser.add_argument("--rounds", type=int, default=5, help="submissions (default 5)")
    parser.add_argument(
        "--backlog", type=int, default=0, help="jobs queued before the viewers connect"
    )
    parser.add_argument("--timeout", type=float, default=10.0, help="per round, seconds")
    parser.add_argument("--no-doc", dest="doc", action="store_false", help="leave the doc alone")
    args = parser.parse_args(argv)

    server_url = configured_database_url()
    database_url = with_database_name(server_url, DATABASE)
    print(f"database {DATABASE}: dropping, creating, migrating", flush=True)
    recreate_database(server_url, DATABASE)
    setup_django(database_url)
    from queueapp.models import Tier
    from queueapp.services import job_submit, member_create

    tier = Tier.objects.order_by("bonus").first()
    assert tier is not None  # the fixtures define the tiers
    _, token = member_create(name="fanout-viewer", tier=tier)
    # Other members' queued jobs: what a viewer sees of them is redacted.
    others = [member_create(name=f"fanout-{n}", tier=tier)[0] for n in range(BACKLOG_MEMBERS)]
    for n in range(args.backlog):
        job_submit(member=others[n % len(others)], model="m", priority_header=None, **JOB)
    machine = machine_info()
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise
    log_path = Path(tempfile.gettempdir()) / f"gpusched-fanout-{os.getpid()}.log"
    print(f"starting daphne (log: {log_path})", flush=True)
    process, url = start_server(database_url, log_path)
    try:
        print(f"{args.clients} viewers connecting, then {args.rounds} submissions", flush=True)
        connects, connect_all_s, rounds = asyncio.run(measure(url, token, args))
    finally:
        stop_server(process)
    text = section(args, machine, connects, connect_all_s, rounds)
    print()
    print(text)
    if args.doc:
        write_doc(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
