#!/usr/bin/env python
"""Large bodies waiting at the front door: what 50 vision chats of 5 MB each
cost the web process's memory and the database while they wait in the queue
(queueapp/frontdoor/calls.py keeps a waiting call's raw bytes only;
queueapp/job_body.py stores a summary of its body).

On its own database (``gpusched_bench_frontdoor_bodies`` on the configured
server: the embedded PostgreSQL unless DATABASE_URL is set, recreated at
every start), with the built-in llama-swap simulator, a GPU cluster and
Daphne (as `make run` starts it) as separate processes. A holder's streaming
chat keeps the one GPU busy; then `--callers` vision chats
(`/v1/chat/completions`, a base64 image of `--body-mb` MB in an `image_url`
part, one member each) arrive at once and wait until their jobs are queued.
Measured: the web process's RSS (psutil, else /proc's VmRSS; with its
children, if any), sampled every 100 ms, at idle (the holder running, before
the burst), at its peak while the calls arrive and wait, and at its peak
while they are served; the peak above idle against the bodies held (goal:
at most twice their size); and what reached PostgreSQL: the jobs' `body`
column (`pg_column_size`, and as JSON text) and the growth of the jobs table
(`pg_total_relation_size`, TOAST included) and of the whole database. Then
the holder hangs up and every call must be answered 200, its body at the
simulator byte for byte (length and sha256 in the simulator's log). The same
burst then comes a second time: RSS does not fall once the calls end (the
allocator keeps what it freed), so the second shows whether the first's
memory is reused or added to.

The peer, in the same run: the same calls through a LiteLLM proxy
(benchmarks/litellm_peer.py) in front of the same simulator, when
`.venv-litellm/` exists (`--litellm` installs it, `--no-litellm` skips it).
LiteLLM queues nothing, so the simulator holds these calls itself (a model
of 600 s with a slot for each): they wait at the upstream with the proxy's
copies in flight. Its RSS at idle (after a warm-up call) and at peak from
the burst until every call has reached the simulator and for the hold after;
then the calls are cancelled. It has no database: nothing of theirs is stored.

Prints the results and rewrites the large-bodies section of
docs/benchmarks.md. Exits 1 when a call fails or a body arrives changed, or
when the memory goal is missed.

    .venv/bin/python benchmarks/frontdoor_bodies.py           # make bench-frontdoor-bodies
    .venv/bin/python benchmarks/frontdoor_bodies.py --callers 10 --no-litellm --no-doc
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import json
import logging
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import harness  # benchmarks/harness.py: database set-up, machine description, doc
import httpx
import litellm_peer  # benchmarks/litellm_peer.py

from gpusched.stack import SimulatorProcess, Stack, wait_for

ROOT = Path(__file__).resolve().parent.parent
DATABASE = "gpusched_bench_frontdoor_bodies"
DOC_PATH = ROOT / "docs" / "benchmarks.md"
START, END = "<!-- frontdoor-bodies:start -->", "<!-- frontdoor-bodies:end -->"
CHAT_PATH = "/v1/chat/completions"

VISION = "vision"  # gpusched's calls and its holder: one model, no swap
PEER_HELD = "vision-held"  # the peer's calls: held at the simulator
HOLD_SECONDS = 600.0  # longer than any run: a hang-up ends the hold
MODEL_SECONDS = {VISION: 0.02, PEER_HELD: HOLD_SECONDS}
PEER_SLOTS = 64  # the simulator's most: every peer call in flight at once

MB = 1_000_000
MIB = 1024 * 1024
RSS_GOAL_FACTOR = 2.0  # peak above idle, at most this many times the bodies held
STORED_JOB_GOAL = 64 * 1024  # a job's body as stored: a summary (tests/e2e/test_large_bodies.py)
SAMPLE_INTERVAL_S = 0.1
IDLE_SAMPLES = 10  # a second of samples makes the idle figure
CALL_TIMEOUT_S = 600.0
ARRIVAL_TIMEOUT_S = 300.0  # for every call to queue (or reach the peer's upstream)


# -- the bodies ----------------------------------------------------------------------------


def image_data_url(megabytes: float) -> str:
    """A data URL of `megabytes` million base64 characters; random bytes, as a
    JPEG's do not compress either."""
    raw = random.Random(1).randbytes(int(megabytes * MB) * 3 // 4)
    return "data:image/jpeg;base64," + base64.b64encode(raw).decode()


def vision_chat(model: str, label: str, image_url: str) -> bytes:
    content = [
        {"type": "text", "text": "What is in this picture?"},
        {"type": "image_url", "image_url": {"url": image_url}},
    ]
    body = {
        "model": model,
        "user": label,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 64,
    }
    return json.dumps(body).encode()


# -- the memory of a process ---------------------------------------------------------------


def _proc_tree(pid: int) -> list[int]:
    pids, pending = [], [pid]
    while pending:
        current = pending.pop()
        pids.append(current)
        for task in Path(f"/proc/{current}/task").glob("*"):
            try:
                pending += [int(child) for child in (task / "children").read_text().split()]
            except OSError:
                continue  # the thread or the process has gone
    return pids


def _vm_rss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass  # gone since it was listed
    return 0


def rss_bytes(pid: int) -> int:
    """The resident memory of `pid` and its descendants."""
    try:
        import psutil
    except ImportError:
        return sum(_vm_rss(each) for each in _proc_tree(pid))
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for process in processes:
        try:
            total += process.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return total


def rss_source() -> str:
    try:
        import psutil
    except ImportError:
        return "/proc/<pid>/status VmRSS"
    return f"psutil {psutil.__version__}"


class RssSampler:
    """A process's RSS every SAMPLE_INTERVAL_S, in a thread of its own."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        wait_for(lambda: self.samples, message="the first RSS sample")
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.monotonic(), rss_bytes(self.pid)))
            self._stop.wait(SAMPLE_INTERVAL_S)  # the sampling period, not a wait for a state

    def between(self, since: float, until: float | None = None) -> list[int]:
        end = time.monotonic() if until is None else until
        return [rss for at, rss in list(self.samples) if since <= at <= end]

    def collect(self, count: int) -> list[int]:
        """The next `count` samples, once taken."""
        since = time.monotonic()
        return wait_for(
            lambda: (taken := self.between(since)) and len(taken) >= count and taken,
            message=f"{count} RSS samples",
            interval=SAMPLE_INTERVAL_S / 2,
        )

    def peak(self, since: float, until: float | None = None) -> int:
        return max(self.between(since, until))


# -- the callers ---------------------------------------------------------------------------


@dataclass
class Outcome:
    done: bool = False
    status: int = 0
    job_id: int = 0
    error: str = ""


class Burst:
    """Chat calls sent at once from an asyncio loop in a thread of its own,
    so that the main thread samples and waits meanwhile."""

    def __init__(self, url: str, tokens: list[str], bodies: list[bytes]) -> None:
        self.url = url
        self.tokens = tokens
        self.bodies = bodies
        self.outcomes = [Outcome() for _ in bodies]
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Future[Any] | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Burst:
        self._thread.start()
        wait_for(lambda: self._task is not None, message="the callers' loop")
        return self

    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()
        try:
            self._loop.run_until_complete(self._all())
        finally:
            self._loop.close()

    async def _all(self) -> None:
        count = len(self.bodies)
        limits = httpx.Limits(max_connections=count + 4, max_keepalive_connections=count + 4)
        timeout = httpx.Timeout(CALL_TIMEOUT_S, connect=30)
        async with httpx.AsyncClient(base_url=self.url, limits=limits, timeout=timeout) as client:
            calls = [self._one(client, index) for index in range(count)]
            self._task = asyncio.gather(*calls)
            try:
                await self._task
            except asyncio.CancelledError:
                pass  # cancelled on purpose: the connections close with the client

    async def _one(self, client: httpx.AsyncClient, index: int) -> None:
        outcome = self.outcomes[index]
        headers = {
            "Authorization": f"Bearer {self.tokens[index]}",
            "Content-Type": "application/json",
        }
        try:
            answer = await client.post(CHAT_PATH, content=self.bodies[index], headers=headers)
            outcome.status = answer.status_code
            outcome.job_id = int(answer.headers.get("x-gpusched-job-id") or 0)
            if answer.status_code != 200:
                outcome.error = answer.text[:300]
        except httpx.HTTPError as exc:
            outcome.error = f"{type(exc).__name__}: {exc}"
        finally:
            outcome.done = True

    def finished(self) -> list[Outcome]:
        return [outcome for outcome in self.outcomes if outcome.done]

    def wait(self, timeout: float) -> None:
        wait_for(
            lambda: len(self.finished()) == len(self.outcomes),
            timeout=timeout,
            message=f"{len(self.outcomes)} calls answered",
            interval=0.05,
        )
        self._thread.join(timeout=30)

    def cancel(self) -> None:
        """Hang up every call still open, and wait until the client has closed."""
        if self._loop is not None and self._task is not None and not self._task.done():
            self._loop.call_soon_threadsafe(self._task.cancel)
        self._thread.join(timeout=60)

    def refused_early(self) -> str:
        """The first call answered while it should still wait: the burst failed."""
        for outcome in self.finished():
            return f"a call ended before the GPU freed: {outcome.status} {outcome.error}"
        return ""


# -- the database --------------------------------------------------------------------------


def queued_jobs(database_url: str, member_ids: list[int]) -> int:
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM queueapp_job WHERE member_id = ANY(%s) AND status = 'queued'",
            [member_ids],
        ).fetchone()
    return int(row[0]) if row else 0


def storage_sizes(database_url: str) -> dict[str, int]:
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT pg_total_relation_size('queueapp_job'), pg_database_size(current_database())"
        ).fetchone()
    assert row is not None
    return {"jobs_table": int(row[0]), "database": int(row[1])}


def stored_bodies(database_url: str, member_ids: list[int]) -> dict[str, int]:
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute(
            """
            SELECT count(*), coalesce(sum(pg_column_size(body)), 0),
                   coalesce(sum(octet_length(body::text)), 0),
                   coalesce(max(octet_length(body::text)), 0)
              FROM queueapp_job WHERE member_id = ANY(%s)
            """,
            [member_ids],
        ).fetchone()
    assert row is not None
    return {"jobs": row[0], "column": row[1], "text": row[2], "largest_text": row[3]}


def job_statuses(database_url: str, member_ids: list[int]) -> dict[str, int]:
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT status, count(*) FROM queueapp_job WHERE member_id = ANY(%s) GROUP BY status",
            [member_ids],
        ).fetchall()
    return {status: count for status, count in rows}


# -- gpusched ------------------------------------------------------------------------------


@contextmanager
def gpu_held(url: str, token: str) -> Iterator[None]:
    """A streaming chat that holds the GPU (its first chunk has come) until
    the block ends, when its caller hangs up and the GPU frees."""
    body = {
        "model": VISION,
        "messages": [{"role": "user", "content": "hold the GPU"}],
        "stream": True,
        "sim": {"seconds": HOLD_SECONDS},
    }
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.stream(
        "POST", f"{url}{CHAT_PATH}", json=body, headers=headers, timeout=60
    ) as holding:
        if holding.status_code != 200:
            raise RuntimeError(f"the holder's call answered {holding.status_code}")
        chunks = holding.iter_raw()  # kept: a dropped iterator closes the connection
        next(chunks)
        yield


def small_call(url: str, token: str, model: str) -> None:
    """One vision chat with a small image, answered: the server's code paths
    and connection pools are warm before idle is measured."""
    body = vision_chat(model, "warm-up", image_data_url(0.01))
    answer = httpx.post(
        f"{url}{CHAT_PATH}",
        content=body,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        timeout=120,
    )
    if answer.status_code != 200:
        raise RuntimeError(f"the warm-up call answered {answer.status_code}: {answer.text[:300]}")


@dataclass
class Round:
    """One server's figures: RSS in bytes, and what reached the database."""

    name: str
    callers: int
    body_bytes: int  # one call's body
    idle: int = 0
    peak_waiting: int = 0
    peak_served: int = 0  # gpusched only: from the holder's hang-up to the last answer
    after: int = 0
    answered: int = 0  # 200s
    identical: int = 0  # bodies the simulator logged with the sent length and sha256
    arrival_seconds: float = 0.0  # from the burst to the last call queued (held)
    stored: dict[str, int] = field(default_factory=dict)
    growth: dict[str, int] = field(default_factory=dict)
    version: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def held(self) -> int:
        return self.callers * self.body_bytes

    @property
    def above_idle(self) -> int:
        return self.peak_waiting - self.idle

    @property
    def goal(self) -> float:
        return RSS_GOAL_FACTOR * self.held


def bodies_at_simulator(simulator: SimulatorProcess, bodies: list[bytes]) -> int:
    """How many of `bodies` the simulator received with the same length and
    sha256 (the callers' 200s say they were answered)."""
    received = {
        (entry["body_bytes"], entry["body_sha256"])
        for entry in simulator.log()
        if entry["path"] == CHAT_PATH
    }
    return sum((len(body), hashlib.sha256(body).hexdigest()) in received for body in bodies)


def gpusched_round(
    args: argparse.Namespace,
    *,
    database_url: str,
    web_url: str,
    web_pid: int,
    simulator: SimulatorProcess,
    holder: str,
    callers: list[tuple[int, str]],
    image_url: str,
) -> Round:
    member_ids = [member_id for member_id, _ in callers]
    bodies = [vision_chat(VISION, f"caller-{n}", image_url) for n in range(len(callers))]
    result = Round("gpusched", len(bodies), len(bodies[0]))
    small_call(web_url, holder, VISION)
    with RssSampler(web_pid) as sampler:
        with gpu_held(web_url, holder):
            result.idle = int(statistics.median(sampler.collect(IDLE_SAMPLES)))
            before = storage_sizes(database_url)
            burst_at = time.monotonic()
            burst = Burst(web_url, [token for _, token in callers], bodies).start()

            def all_queued() -> bool:
                refused = burst.refused_early()
                if refused:
                    raise RuntimeError(refused)
                return queued_jobs(database_url, member_ids) == len(bodies)

            wait_for(
                all_queued,
                timeout=ARRIVAL_TIMEOUT_S,
                message=f"{len(bodies)} calls queued",
                interval=0.1,
            )
            result.arrival_seconds = time.monotonic() - burst_at
            result.stored = stored_bodies(database_url, member_ids)
            after = storage_sizes(database_url)
            result.growth = {name: after[name] - before[name] for name in after}
            sampler.collect(args.hold_samples)  # the calls go on waiting: does memory stay?
            if burst.refused_early():
                raise RuntimeError(burst.refused_early())
            released_at = time.monotonic()
            result.peak_waiting = sampler.peak(burst_at, released_at)
        burst.wait(timeout=ARRIVAL_TIMEOUT_S)
        result.peak_served = sampler.peak(released_at)
        result.after = int(statistics.median(sampler.collect(IDLE_SAMPLES)))
    result.answered = sum(outcome.status == 200 for outcome in burst.outcomes)
    errors = [f"{o.status} {o.error}" for o in burst.outcomes if o.status != 200]
    result.notes += [f"gpusched call failed: {error}" for error in errors[:3]]
    try:
        # The web process writes a job's end while its answer goes out.
        wait_for(
            lambda: job_statuses(database_url, member_ids) == {"succeeded": len(bodies)},
            message="every job succeeded",
            interval=0.1,
        )
    except TimeoutError:
        statuses = job_statuses(database_url, member_ids)
        result.notes.append(f"gpusched jobs after the run: {statuses}")
    result.identical = bodies_at_simulator(simulator, bodies)
    simulator.reset_log()  # the log holds the parsed bodies: let the simulator drop them
    return result


# -- the peer ------------------------------------------------------------------------------


def connections_to(pid: int, port: int) -> int:
    """Established TCP connections from `pid` and its descendants to `port`."""
    import psutil

    root = psutil.Process(pid)
    count = 0
    for process in [root, *root.children(recursive=True)]:
        for conn in process.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_ESTABLISHED and conn.raddr and conn.raddr.port == port:
                count += 1
    return count


def peer_round(
    args: argparse.Namespace, *, simulator: SimulatorProcess, log_dir: Path, image_url: str
) -> Round:
    bodies = [vision_chat(PEER_HELD, f"peer-{n}", image_url) for n in range(args.callers)]
    result = Round("LiteLLM", len(bodies), len(bodies[0]))
    proxy = litellm_peer.LiteLlmProxy.start(
        upstream=f"{simulator.url}/v1", models=[VISION, PEER_HELD], log_dir=log_dir
    )
    result.version = proxy.version
    try:
        small_call(proxy.url, proxy.key, VISION)
        with RssSampler(proxy.process.pid) as sampler:
            result.idle = int(statistics.median(sampler.collect(IDLE_SAMPLES)))
            burst_at = time.monotonic()
            burst = Burst(proxy.url, [proxy.key] * len(bodies), bodies).start()

            def all_connected() -> bool:
                refused = burst.refused_early()
                if refused:
                    raise RuntimeError(refused)
                return connections_to(proxy.process.pid, simulator.port) >= len(bodies)

            def all_at_simulator() -> int:
                """How many calls the simulator holds, once all of them: an entry
                is logged once its body is read. Each read of the log carries
                the bodies (5 MB each), so it is read once a second only."""
                held = sum(
                    entry["model"] == PEER_HELD
                    and entry["started_at"] is not None
                    and entry["body_bytes"] >= MB
                    for entry in simulator.log()
                )
                return held if held >= len(bodies) else 0

            message = f"{len(bodies)} calls through LiteLLM"
            wait_for(all_connected, timeout=ARRIVAL_TIMEOUT_S, message=message, interval=0.1)
            result.identical = wait_for(
                all_at_simulator, timeout=ARRIVAL_TIMEOUT_S, message=message, interval=1.0
            )
            result.arrival_seconds = time.monotonic() - burst_at
            sampler.collect(args.hold_samples)
            result.peak_waiting = sampler.peak(burst_at)
            burst.cancel()
            result.after = int(statistics.median(sampler.collect(IDLE_SAMPLES)))
        refused = [o for o in burst.outcomes if o.done and o.status not in (0, 200)]
        result.notes += [f"LiteLLM call failed: {o.status} {o.error}" for o in refused[:3]]
        result.notes.append(
            f"LiteLLM: every call's body reached the simulator ({MB:,} bytes or more each: "
            "LiteLLM re-encodes the JSON, so not byte for byte) before the hold; the log is "
            "read once a second for it, which costs CPU beside the proxy. Then the callers "
            "hung up."
        )
    finally:
        proxy.stop()
    return result


# -- the report ----------------------------------------------------------------------------


def mb(value: float) -> str:
    return f"{value / MB:,.0f} MB"


def _met(held: bool) -> str:
    return "yes" if held else "**no**"


def gpusched_rows(first: Round, second: Round | None) -> list[str]:
    goal = f"≤ {mb(first.goal)} ({RSS_GOAL_FACTOR:g} × the bodies)"
    stored = first.stored
    rows = [
        f"| gpusched: RSS at idle | {mb(first.idle)} | - | - |",
        f"| gpusched: RSS peak while the {first.callers} calls arrive and wait "
        f"| {mb(first.peak_waiting)} | - | - |",
        f"| gpusched: peak above idle, {first.callers} × {first.body_bytes / MB:.1f} MB = "
        f"{mb(first.held)} of bodies held | {mb(first.above_idle)} "
        f"({first.above_idle / first.held:.2f} × the bodies) | {goal} "
        f"| {_met(first.above_idle <= first.goal)} |",
        f"| gpusched: RSS peak while they are served, above idle "
        f"| {mb(first.peak_served - first.idle)} | {goal} "
        f"| {_met(first.peak_served - first.idle <= first.goal)} |",
        f"| gpusched: RSS once all are answered | {mb(first.after)} | - | - |",
        f"| gpusched: answered 200 / body at llama-swap byte for byte (length, sha256) "
        f"| {first.answered} / {first.identical} of {first.callers} | all "
        f"| {_met(first.answered == first.identical == first.callers)} |",
        f"| gpusched: the {stored.get('jobs', 0)} jobs' `body` in PostgreSQL, "
        f"`pg_column_size` (as JSON text) | {stored.get('column', 0):,} B "
        f"({stored.get('text', 0):,} B; the largest {stored.get('largest_text', 0):,} B) "
        f"| a summary: under {STORED_JOB_GOAL // 1024} KiB a job "
        f"| {_met(stored.get('largest_text', STORED_JOB_GOAL) < STORED_JOB_GOAL)} |",
        f"| gpusched: growth of the jobs table (`pg_total_relation_size`, TOAST included) / "
        f"of the database while they queued | {first.growth.get('jobs_table', 0):,} B / "
        f"{first.growth.get('database', 0):,} B | - | - |",
        f"| gpusched: from the burst to the last job queued "
        f"| {first.arrival_seconds:.1f} s | - | - |",
    ]
    if second is not None:
        above = second.peak_waiting - first.idle
        rows += [
            "| gpusched, a second burst of the same calls: RSS before / peak / once answered "
            f"| {mb(second.idle)} / {mb(second.peak_waiting)} / {mb(second.after)} | - | - |",
            f"| gpusched, second burst: peak above the first idle | {mb(above)} | {goal} "
            f"| {_met(above <= first.goal)} |",
            f"| gpusched, second burst: answered 200 / body byte for byte "
            f"| {second.answered} / {second.identical} of {second.callers} | all "
            f"| {_met(second.answered == second.identical == second.callers)} |",
        ]
    return rows


def peer_rows(peer: Round, goal: str) -> list[str]:
    name = f"{peer.name} {peer.version}"
    return [
        f"| {name}: RSS at idle (after a warm-up call) | {mb(peer.idle)} | - | - |",
        f"| {name}: RSS peak while the {peer.callers} calls arrive and are held "
        f"| {mb(peer.peak_waiting)} | - | - |",
        f"| {name}: peak above idle, {mb(peer.held)} of bodies held | {mb(peer.above_idle)} "
        f"({peer.above_idle / peer.held:.2f} × the bodies) | (gpusched's: {goal}) | - |",
        f"| {name}: calls at the simulator in full, held "
        f"| {peer.identical} of {peer.callers} | all | {_met(peer.identical == peer.callers)} |",
        f"| {name}: from the burst to the last call seen at the simulator (its log read "
        f"once a second) | ≤ {peer.arrival_seconds:.1f} s | - | - |",
        f"| {name}: bytes in a database | none: a stateless proxy here | - | - |",
    ]


def section(
    args: argparse.Namespace,
    machine: dict[str, str],
    rounds: Rounds,
    timings: list[tuple[str, float]],
) -> str:
    first = rounds.first
    goal = f"≤ {mb(first.goal)}"
    rows = gpusched_rows(first, rounds.second)
    if rounds.peer is not None:
        rows += peer_rows(rounds.peer, goal)
    notes = [note for r in rounds.all() for note in r.notes]
    if rounds.peer_note:
        notes.append(rounds.peer_note)
    out = [
        f"Run on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC with `benchmarks/frontdoor_bodies.py "
        f"--callers {args.callers} --body-mb {args.body_mb:g}`; RSS from {rss_source()}, "
        f"every {SAMPLE_INTERVAL_S * 1000:.0f} ms. Run time: "
        + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in timings)
        + ".",
        "",
        f"{first.callers} vision chats of {first.body_bytes:,} bytes each (a base64 image in an "
        "`image_url` part, one member each) arrive at once while a holder's stream keeps the "
        "GPU busy, and wait in the queue; then the holder hangs up and they are served, one "
        "20 ms job each. Idle: the web process with the holder running, before the burst "
        "(median of a second's samples). The peak while waiting runs from the burst to "
        f"{args.hold_samples} samples after the last job queued.",
        "",
        "| Figure | Measured | Goal | Met |",
        "|---|---|---|---|",
        *rows,
        "",
        *(f"- Note: {note}" for note in notes),
        *(f"- {key}: {value}" for key, value in machine.items()),
        "- Load average at end (1/5/15 min): " + " / ".join(f"{v:.2f}" for v in os.getloadavg()),
    ]
    return "\n".join(out).rstrip() + "\n"


def met(rounds: Rounds) -> bool:
    """gpusched's checks and goals (the peer's figures are for comparison)."""
    first, second = rounds.first, rounds.second
    served = [first] if second is None else [first, second]
    return (
        all(r.answered == r.identical == r.callers for r in served)
        and first.above_idle <= first.goal
        and first.peak_served - first.idle <= first.goal
        and (second is None or second.peak_waiting - first.idle <= first.goal)
        and first.stored.get("largest_text", STORED_JOB_GOAL) < STORED_JOB_GOAL
        and not any(note.startswith("gpusched") for r in served for note in r.notes)
    )


@dataclass
class Rounds:
    first: Round
    second: Round | None = None
    peer: Round | None = None
    peer_note: str = ""

    def all(self) -> list[Round]:
        return [r for r in (self.first, self.second, self.peer) if r is not None]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--callers", type=int, default=50)
    parser.add_argument("--body-mb", type=float, default=5.0, help="each image, in million bytes")
    parser.add_argument(
        "--hold-samples",
        type=int,
        default=20,
        help="RSS samples taken while every call waits, before the GPU frees",
    )
    peer = parser.add_mutually_exclusive_group()
    peer.add_argument(
        "--litellm",
        dest="litellm",
        action="store_true",
        default=None,
        help="measure the LiteLLM peer, installing .venv-litellm/ when missing",
    )
    peer.add_argument("--no-litellm", dest="litellm", action="store_false")
    parser.add_argument("--no-doc", dest="doc", action="store_false", help="leave the doc alone")
    return parser.parse_args(argv)


def peer_wanted(args: argparse.Namespace) -> tuple[bool, str]:
    """Whether to measure LiteLLM, and if not, why not."""
    if args.litellm is False:
        return False, "LiteLLM not measured (--no-litellm)."
    try:
        import psutil  # noqa: F401  (its connections tell when the calls are at the upstream)
    except ImportError:
        return False, "LiteLLM not measured: psutil is not installed."
    if args.litellm is None and not (litellm_peer.PEER_VENV / "bin" / "litellm").exists():
        return False, (
            "LiteLLM not measured: .venv-litellm/ is absent (`--litellm` installs it, as "
            "`make bench-frontdoor` does)."
        )
    return True, ""


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not 1 <= args.callers <= PEER_SLOTS:
        raise SystemExit(f"--callers: 1 to {PEER_SLOTS} (the simulator's slots for the peer)")
    started = time.monotonic()
    database_url = harness.fresh_database(DATABASE)
    machine = harness.machine_info()
    for name in ("httpx", "httpcore"):
        logging.getLogger(name).setLevel(logging.WARNING)
    from django.db import connection

    from queueapp.models import Tier
    from queueapp.services import member_create

    Tier.objects.all().update(max_queued_jobs=args.callers + 10)
    tier = Tier.objects.get(name="max")
    holder = member_create(name="holder", tier=tier)[1]
    # Each burst has members of its own, so that each job is found by its member.
    bursts = [
        [
            (member.pk, token)
            for member, token in (
                member_create(name=f"burst-{burst}-caller-{n}", tier=tier)
                for n in range(args.callers)
            )
        ]
        for burst in range(2)
    ]
    connection.close()
    image_url = image_data_url(args.body_mb)
    use_peer, peer_note = peer_wanted(args)
    log_dir = Path(tempfile.mkdtemp(prefix="gpusched-bench-frontdoor-bodies-"))
    print(f"logs: {log_dir}", flush=True)
    timings = [("set-up", time.monotonic() - started)]

    def timed(name: str, measure: Callable[[], Round]) -> Round:
        print(f"{name}: {args.callers} calls of {args.body_mb:g} MB", flush=True)
        phase_at = time.monotonic()
        result = measure()
        timings.append((name, time.monotonic() - phase_at))
        print(f"  {result}", flush=True)
        return result

    with Stack(database_url=database_url, log_dir=log_dir) as stack:
        simulator = stack.start_simulator(
            models=MODEL_SECONDS, parallel_models={PEER_HELD: PEER_SLOTS}
        )
        stack.start_cluster()
        web = stack.start_web()

        def burst(callers: list[tuple[int, str]]) -> Round:
            return gpusched_round(
                args,
                database_url=database_url,
                web_url=web.url,
                web_pid=web.pid,
                simulator=simulator,
                holder=holder,
                callers=callers,
                image_url=image_url,
            )

        rounds = Rounds(first=timed("gpusched", lambda: burst(bursts[0])), peer_note=peer_note)
        # The same calls again: is the first burst's memory reused, or added to?
        rounds.second = timed("gpusched, second burst", lambda: burst(bursts[1]))
        if use_peer:
            rounds.peer = timed(
                "LiteLLM",
                lambda: peer_round(args, simulator=simulator, log_dir=log_dir, image_url=image_url),
            )
    timings.append(("in all", time.monotonic() - started))
    text = section(args, machine, rounds, timings)
    print()
    print(text)
    print(f"logs: {log_dir}")
    if args.doc:
        harness.write_between_markers(
            DOC_PATH, START, END, heading="## Front door: large bodies", text=text
        )
    return 0 if met(rounds) else 1


if __name__ == "__main__":
    sys.exit(main())
