#!/usr/bin/env python
"""Benchmark of the OpenAI-compatible front door (queueapp/frontdoor/), side by side.

One run, on its own database (``gpusched_bench_frontdoor`` on the configured
server: the embedded PostgreSQL unless DATABASE_URL is set, recreated at every
start), with the built-in llama-swap simulator, a GPU cluster (`manage.py
qcluster`) and Daphne (as `make run` starts it, GPUSCHED_DB_POOL=20) as
separate processes, through the official `openai` package:

1. latency added over calling the simulator directly: sequential chat calls,
   idle GPU, the same client type and body on both paths, interleaved with
   the same calls through a LiteLLM proxy in front of the same simulator
   (benchmarks/litellm_peer.py, its own `.venv-litellm/`; `--no-litellm`
   skips it): the peer whose added latency gpusched's must not exceed;
2. a burst of concurrent callers (AsyncOpenAI + asyncio.gather, in a process
   of their own) of 20 ms jobs on one web process: errors, overlapping
   upstream requests (from the simulator's log), wall time against the
   ideal; meanwhile `GET /api/health/` every 50 ms, the database connections
   of the bench database and the web process's RSS;
3. the dispatch gap (simulator idle time between two requests) with a backlog
   of front-door calls, and with a backlog submitted by `POST /api/jobs/`;
4. SIGKILL of the web process with callers waiting: GPU time lost until the
   next caller (through a second web process) reaches the simulator, and what
   became of the waiting jobs.

Prints the results and rewrites the front-door section of docs/benchmarks.md.
Exits 1 when a correctness check fails (an error, an overlap, a waiting job
left queued or run after the kill); a missed time goal is a figure to read.

    .venv/bin/python benchmarks/frontdoor.py                  # make bench-frontdoor
    .venv/bin/python benchmarks/frontdoor.py --latency-calls 50 --callers 200 \\
        --kill-callers 30 --gap-jobs 50 --no-doc              # a quick check
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import re
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import harness  # benchmarks/harness.py: database set-up, machine description, percentile, doc
import httpx
from litellm_peer import LiteLlmProxy  # benchmarks/litellm_peer.py

from gpusched.stack import GpuCluster, SimulatorProcess, Stack, wait_for

ROOT = Path(__file__).resolve().parent.parent
DATABASE = "gpusched_bench_frontdoor"
DOC_PATH = ROOT / "docs" / "benchmarks.md"
START, END = "<!-- frontdoor:start -->", "<!-- frontdoor:end -->"
POOL = 20  # GPUSCHED_DB_POOL of the web processes, as run_all sets it

# The simulator's models: seconds per job, swaps free.
INSTANT, BURST, SLOW = "instant", "burst-20ms", "slow-200ms"
MODEL_SECONDS = {INSTANT: 0.0, BURST: 0.02, SLOW: 0.2}

ADDED_P50_GOAL_MS = 5.0
ADDED_P99_GOAL_MS = 20.0
WALL_GOAL_FACTOR = 1.5
HEALTH_P99_GOAL_MS = 100.0
KILL_LOST_GOAL_S = 2.0
FRONT_DOOR_GAP_P50_GOAL_MS = 10.0

HEALTH_INTERVAL_S = 0.05
SAMPLE_INTERVAL_S = 0.1
WARMUP_CALLS = 20


# -- the callers' process ------------------------------------------------------------------


def raise_open_files_limit() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else 65536
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


async def callers_main(spec: dict[str, Any]) -> dict[str, Any]:
    """`count` concurrent chat calls through one shared connection pool (the
    SDK's own HTTP client, with room for every caller), one AsyncOpenAI client
    per member; each call records its times and outcome."""
    import httpx2
    import openai

    count = spec["count"]
    limits = httpx2.Limits(max_connections=count + 10, max_keepalive_connections=count + 10)
    timeout = httpx2.Timeout(spec["timeout"], connect=spec["connect_timeout"])
    results: list[dict[str, Any]] = [{} for _ in range(count)]
    async with openai.DefaultAsyncHttpxClient(limits=limits, timeout=timeout) as http:
        clients = [
            openai.AsyncOpenAI(
                base_url=f"{spec['url']}/v1", api_key=token, max_retries=0, http_client=http
            )
            for token in spec["tokens"]
        ]

        # At most this many calls at once (a client-side queue; 0: all at once).
        at_once = asyncio.Semaphore(spec.get("at_once") or count)

        async def one(index: int) -> None:
            label = f"{spec['label']}-{index:05d}"
            record: dict[str, Any] = {"label": label, "t0": time.time()}
            results[index] = record
            try:
                async with at_once:
                    raw = await clients[
                        index % len(clients)
                    ].chat.completions.with_raw_response.create(
                        model=spec["model"],
                        messages=[{"role": "user", "content": f"front-door benchmark {label}"}],
                        user=label,
                        stream=bool(spec.get("stream")),
                    )
                    parsed = raw.parse()
                    if spec.get("stream"):
                        pieces = [
                            chunk.choices[0].delta.content or ""
                            async for chunk in parsed
                            if chunk.choices
                        ]
                        ok = bool("".join(pieces))
                    else:
                        ok = bool(parsed.choices and parsed.choices[0].message.content)
                record.update(
                    status=raw.status_code,
                    job=int(raw.headers.get("x-gpusched-job-id") or 0) or None,
                    ok=ok,
                )
            except openai.APIStatusError as exc:
                record.update(status=exc.status_code, error=str(exc)[:300])
            except Exception as exc:  # connection refused/reset, timeout
                record.update(status=0, error=f"{type(exc).__name__}: {exc}"[:300])
            record["t1"] = time.time()

        tasks = [asyncio.ensure_future(one(index)) for index in range(count)]
        started = time.time()
        print(f"callers: {count} started", flush=True)
        done, pending = await asyncio.wait(tasks, timeout=spec["deadline"])
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for record in results:
            if "t1" not in record:
                record.update(status=0, error="cancelled at the deadline", t1=time.time())
    return {"started": started, "ended": time.time(), "results": results}


def callers_process(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    raise_open_files_limit()
    for name in ("httpx", "httpx2", "openai"):
        logging.getLogger(name).setLevel(logging.WARNING)
    outcome = asyncio.run(callers_main(spec))
    Path(spec["out"]).write_text(json.dumps(outcome))
    return 0


class Callers:
    """The callers' process, started from the benchmark."""

    def __init__(self, log_dir: Path, name: str, **spec: Any) -> None:
        self.spec_path = log_dir / f"{name}-spec.json"
        self.out_path = log_dir / f"{name}-out.json"
        self.log_path = log_dir / f"{name}.log"
        spec.setdefault("timeout", 300.0)
        spec.setdefault("connect_timeout", 60.0)
        spec.setdefault("deadline", 240.0)
        spec.update(out=str(self.out_path), label=name)
        self.spec_path.write_text(json.dumps(spec))
        self.deadline = spec["deadline"] + 30
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, __file__, "--callers", str(self.spec_path)],
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait(self) -> dict[str, Any]:
        try:
            self.process.wait(timeout=self.deadline)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)
            raise RuntimeError(f"the callers' process did not end; see {self.log_path}") from None
        if self.process.returncode != 0 or not self.out_path.exists():
            raise RuntimeError(f"the callers' process failed; see {self.log_path}")
        return json.loads(self.out_path.read_text())

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)


# -- processes -----------------------------------------------------------------------------


@dataclass
class Processes:
    """The stack (gpusched/stack.py) on the bench database: the simulator, one
    GPU cluster and the web servers, each a process of its own."""

    stack: Stack
    simulator: SimulatorProcess | None = None
    cluster: GpuCluster | None = None
    backlog_seen: str = ""

    @property
    def log_dir(self) -> Path:
        return self.stack.log_dir

    @property
    def database_url(self) -> str:
        return self.stack.database_url

    @property
    def sim_url(self) -> str:
        assert self.simulator is not None
        return self.simulator.url

    def start_simulator(self) -> str:
        self.simulator = self.stack.start_simulator(models=MODEL_SECONDS)
        return self.simulator.url

    def start_cluster(self) -> None:
        self.cluster = self.stack.start_cluster()

    def start_web(self) -> tuple[subprocess.Popen, str]:
        """Daphne as run_all starts it (its listen backlog raised)."""
        server = self.stack.start_web(GPUSCHED_DB_POOL=str(POOL))
        assert server.process is not None
        if not self.backlog_seen:
            self.backlog_seen = listen_backlog(server.port)
        return server.process, server.url

    def check_alive(self) -> None:
        """The cluster and the simulator run (the kill benchmark kills a web server)."""
        for process in (self.cluster, self.simulator):
            if process is not None:
                process.check_alive()

    def stop(self) -> None:
        self.stack.stop()


def source_state() -> str:
    """The commit measured, and the product files changed in the work tree."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        changed = subprocess.run(
            ["git", "status", "--porcelain", "--", "queueapp", "gpusched"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout.split("\n")
    except OSError:
        return "unknown"
    files = [line[3:] for line in changed if line.strip()]
    return f"{head}" + (f", with uncommitted changes to {', '.join(files)}" if files else "")


def listen_backlog(port: int) -> str:
    """The listening socket's backlog as the kernel reports it (`ss`: Send-Q)."""
    try:
        out = subprocess.run(
            ["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True, timeout=5
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown (no ss)"
    fields = out.split()
    return fields[2] if len(fields) >= 3 else "unknown"


def sim_log(sim_url: str) -> list[dict[str, Any]]:
    response = httpx.get(f"{sim_url}/sim/log", timeout=30)
    response.raise_for_status()
    return response.json()


def sim_reset(sim_url: str) -> None:
    httpx.post(f"{sim_url}/sim/reset", timeout=10).raise_for_status()


def label_of(entry: dict[str, Any]) -> str:
    body = entry.get("body")
    return str(body.get("user", "")) if isinstance(body, dict) else ""


# -- /proc and pg_stat_activity ------------------------------------------------------------


def rss_kib(pid: int) -> int:
    match = re.search(r"VmRSS:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text())
    return int(match.group(1)) if match else 0


def socket_inodes(pid: int) -> set[str]:
    inodes = set()
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return inodes
    for name in names:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def tcp_table() -> list[tuple[int, int, str, str]]:
    """(local port, remote port, state, inode) of every IPv4 TCP socket."""
    rows = []
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        parts = line.split()
        if len(parts) < 10:
            continue
        rows.append(
            (int(parts[1].split(":")[1], 16), int(parts[2].split(":")[1], 16), parts[3], parts[9])
        )
    return rows


@dataclass
class Sample:
    at: float
    pg_total: int  # connections to the bench database (the sampler's own left out)
    pg_active: int  # of those, not idle
    web_open: int  # the web process's connections to PostgreSQL
    web_active: int
    callers_connected: int  # established connections to the web port
    waiting_jobs: int  # the burst's front-door jobs queued or running
    rss_kib: int


class Sampler:
    """`GET /api/health/` every 50 ms, and every 100 ms the bench database's
    connections, the web process's RSS and its callers, in two threads."""

    def __init__(
        self, database_url: str, web_pid: int, web_url: str, member_ids: list[int]
    ) -> None:
        self.database_url = database_url
        self.web_pid = web_pid
        self.web_url = web_url
        self.web_port = int(web_url.rsplit(":", 1)[1])
        self.pg_port = int(urlsplit(database_url).port or 5432)
        self.member_ids = member_ids
        self.health: list[tuple[float, float, int]] = []  # (at, ms, status; 0 = error)
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._poll_health, daemon=True),
            threading.Thread(target=self._sample, daemon=True),
        ]

    def __enter__(self) -> Sampler:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=15)

    def _poll_health(self) -> None:
        with httpx.Client(base_url=self.web_url, timeout=5) as http:
            while not self._stop.is_set():
                at = time.time()
                start = time.perf_counter()
                try:
                    status = http.get("/api/health/").status_code
                except httpx.HTTPError:
                    status = 0
                ms = (time.perf_counter() - start) * 1000
                self.health.append((at, ms, status))
                self._stop.wait(max(0.0, HEALTH_INTERVAL_S - ms / 1000))

    def _sample(self) -> None:
        import psycopg

        name = urlsplit(self.database_url).path.lstrip("/")
        with psycopg.connect(self.database_url, autocommit=True) as conn:
            while not self._stop.is_set():
                at = time.time()
                try:
                    self.samples.append(self._one(conn, name, at))
                except Exception as exc:  # the web process may be gone: keep going
                    print(f"  sampler: {exc!r}", flush=True)
                self._stop.wait(max(0.0, SAMPLE_INTERVAL_S - (time.time() - at)))

    def _one(self, conn: Any, name: str, at: float) -> Sample:
        activity = conn.execute(
            "SELECT client_port, state FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()",
            [name],
        ).fetchall()
        waiting = conn.execute(
            "SELECT count(*) FROM queueapp_job WHERE front_door AND member_id = ANY(%s) "
            "AND status IN ('queued', 'running')",
            [self.member_ids],
        ).fetchone()[0]
        inodes = socket_inodes(self.web_pid)
        table = tcp_table()
        web_pg_ports = {
            local for local, remote, _, inode in table if remote == self.pg_port and inode in inodes
        }
        connected = sum(
            1
            for local, _, state, inode in table
            if local == self.web_port and state == "01" and inode in inodes
        )
        web = [state for port, state in activity if port in web_pg_ports]
        return Sample(
            at=at,
            pg_total=len(activity),
            pg_active=sum(1 for _, state in activity if state and state != "idle"),
            web_open=len(web),
            web_active=sum(1 for state in web if state and state != "idle"),
            callers_connected=connected,
            waiting_jobs=waiting,
            rss_kib=rss_kib(self.web_pid),
        )


# -- report --------------------------------------------------------------------------------


@dataclass
class Figure:
    name: str
    measured: str
    goal: str
    met: bool | None  # None: reported, no goal
    check: bool = False  # a correctness check (fails the run), not a time goal


@dataclass
class Report:
    args: argparse.Namespace
    machine: dict[str, str] = field(default_factory=dict)
    figures: list[Figure] = field(default_factory=list)
    sections: list[str] = field(default_factory=list)
    timings: list[tuple[str, float]] = field(default_factory=list)
    log_dir: Path | None = None
    backlog: str = "?"  # Daphne's listen backlog as the kernel reports it
    notes: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)

    def add(self, *args: Any, **kwargs: Any) -> None:
        figure = Figure(*args, **kwargs)
        self.figures.append(figure)
        verdict = {True: "met", False: "NOT MET", None: "-"}[figure.met]
        print(f"  {figure.name}: {figure.measured} (goal {figure.goal}: {verdict})", flush=True)

    @property
    def checks_ok(self) -> bool:
        return all(figure.met is not False for figure in self.figures if figure.check)


def pct(values: list[float], p: float) -> float:
    return harness.percentile(values, p) if values else float("nan")


def stats_row(name: str, values: list[float]) -> str:
    if not values:
        return f"| {name} | 0 | - | - | - | - | - |"
    return (
        f"| {name} | {len(values)} | {pct(values, 50):.2f} | {pct(values, 90):.2f} "
        f"| {pct(values, 99):.2f} | {max(values):.2f} | {sum(values) / len(values):.2f} |"
    )


STATS_HEAD = (
    "| | n | p50 ms | p90 ms | p99 ms | max ms | mean ms |\n|---|---:|---:|---:|---:|---:|---:|"
)


def claimed_by(job_ids: list[int]) -> dict[int, str]:
    """Who claimed each job: the web process for its own callers (no hop), or
    the dispatcher (which then notifies the web process)."""
    from queueapp.models import JobEvent

    rows = JobEvent.objects.filter(job_id__in=job_ids, kind="started").values_list(
        "job_id", "detail__worker"
    )
    return {
        job_id: "web process" if str(worker).startswith("frontdoor@") else "dispatcher"
        for job_id, worker in rows
    }


def claimers(job_ids: list[int]) -> dict[str, int]:
    return dict(Counter(claimed_by(job_ids).values()))


# -- CPU time ------------------------------------------------------------------------------


TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()


def cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        fields = _stat(pid)
        if fields:
            total += int(fields[11]) + int(fields[12])  # utime, stime (all threads)
    return total / TICK


def group_pids(pgid: int) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat(int(entry.name))
            if fields and int(fields[2]) == pgid:
                pids.append(int(entry.name))
    return pids


def backend_pids(database_url: str) -> list[int]:
    import psycopg

    name = urlsplit(database_url).path.lstrip("/")
    with psycopg.connect(database_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            [name],
        ).fetchall()
    return [pid for (pid,) in rows]


class CpuMeter:
    """CPU time of the web process, the GPU cluster's processes, the bench
    database's PostgreSQL backends and the simulator over a phase (backends
    that end within it lose their share)."""

    def __init__(self, procs: Processes, web_pid: int) -> None:
        self.procs, self.web_pid = procs, web_pid
        self.before = self._now()

    def _now(self) -> dict[str, dict[int, float]]:
        groups = {
            "web process": [self.web_pid],
            "GPU cluster": group_pids(self.procs.cluster.process.pid),
            "PostgreSQL backends": backend_pids(self.procs.database_url),
            "simulator": [self.procs.simulator.pid],
        }
        return {name: {pid: cpu_seconds([pid]) for pid in pids} for name, pids in groups.items()}

    def spent(self) -> dict[str, float]:
        after = self._now()
        return {
            name: sum(seconds - self.before[name].get(pid, 0.0) for pid, seconds in pids.items())
            for name, pids in after.items()
        }


def cpu_line(spent: dict[str, float], per: int, what: str) -> str:
    parts = ", ".join(f"{name} {seconds / per * 1000:.1f} ms" for name, seconds in spent.items())
    return f"CPU time per {what}: {parts} (clock tick {1000 / TICK:g} ms)."


def commit_latency(database_url: str, count: int = 200) -> list[float]:
    """A one-row INSERT and its COMMIT (the WAL flush) on this server, ms."""
    import psycopg

    samples = []
    with psycopg.connect(database_url) as conn:
        conn.execute("CREATE TABLE bench_commit (id bigserial PRIMARY KEY, v int)")
        conn.commit()
        for index in range(count):
            start = time.perf_counter()
            conn.execute("INSERT INTO bench_commit (v) VALUES (%s)", [index])
            conn.commit()
            samples.append((time.perf_counter() - start) * 1000)
        conn.execute("DROP TABLE bench_commit")
        conn.commit()
    return samples


# -- 1. added latency ----------------------------------------------------------------------


def latency_benchmark(
    report: Report,
    procs: Processes,
    web: subprocess.Popen,
    web_url: str,
    token: str,
    peer: LiteLlmProxy | None = None,
) -> None:
    """Sequential chat calls, alternating direct, through gpusched and (with
    `peer`) through a LiteLLM proxy in front of the same simulator, same
    client type (openai.OpenAI) and same body; the GPU is idle between calls."""
    from openai import OpenAI

    from queueapp.models import Job

    calls = report.args.latency_calls
    direct = OpenAI(base_url=f"{procs.sim_url}/v1", api_key="unused", max_retries=0, timeout=30)
    through = OpenAI(base_url=f"{web_url}/v1", api_key=token, max_retries=0, timeout=30)
    litellm = (
        OpenAI(base_url=f"{peer.url}/v1", api_key=peer.key, max_retries=0, timeout=30)
        if peer is not None
        else None
    )

    def call(client: OpenAI, label: str) -> dict[str, Any]:
        t0 = time.time()
        start = time.perf_counter()
        raw = client.chat.completions.with_raw_response.create(
            model=INSTANT,
            messages=[{"role": "user", "content": "front-door latency probe"}],
            user=label,
        )
        completion = raw.parse()
        ms = (time.perf_counter() - start) * 1000
        if raw.status_code != 200 or not completion.choices:
            raise RuntimeError(f"{label}: {raw.status_code}")
        job = raw.headers.get("x-gpusched-job-id")
        return {"label": label, "t0": t0, "t1": time.time(), "ms": ms, "job": job and int(job)}

    for index in range(WARMUP_CALLS):
        call(direct, f"warm-d-{index}")
        call(through, f"warm-g-{index}")
        if litellm is not None:
            call(litellm, f"warm-l-{index}")
    sim_reset(procs.sim_url)
    meter = CpuMeter(procs, web.pid)
    direct_calls, through_calls, peer_calls = [], [], []
    for index in range(calls):
        # Alternating, so that drift of the machine's load hits all alike.
        direct_calls.append(call(direct, f"lat-d-{index:04d}"))
        through_calls.append(call(through, f"lat-g-{index:04d}"))
        if litellm is not None:
            peer_calls.append(call(litellm, f"lat-l-{index:04d}"))
        time.sleep(0.005)
    spent = meter.spent()
    direct.close()
    through.close()
    if litellm is not None:
        litellm.close()
    entries = {label_of(entry): entry for entry in sim_log(procs.sim_url)}
    direct_ms = [c["ms"] for c in direct_calls]
    through_ms = [c["ms"] for c in through_calls]
    added_p50 = pct(through_ms, 50) - pct(direct_ms, 50)
    added_p99 = pct(through_ms, 99) - pct(direct_ms, 99)
    report.add(
        f"Latency added, p50 ({calls} sequential chat calls, idle GPU)",
        f"{added_p50:.2f} ms (direct {pct(direct_ms, 50):.2f}, through gpusched "
        f"{pct(through_ms, 50):.2f})",
        f"≤ {ADDED_P50_GOAL_MS:g} ms",
        added_p50 <= ADDED_P50_GOAL_MS,
    )
    report.add(
        "Latency added, p99",
        f"{added_p99:.2f} ms (direct {pct(direct_ms, 99):.2f}, through gpusched "
        f"{pct(through_ms, 99):.2f})",
        f"≤ {ADDED_P99_GOAL_MS:g} ms",
        added_p99 <= ADDED_P99_GOAL_MS,
    )
    peer_ms = [c["ms"] for c in peer_calls]
    if peer is not None:
        peer_p50 = pct(peer_ms, 50) - pct(direct_ms, 50)
        peer_p99 = pct(peer_ms, 99) - pct(direct_ms, 99)
        report.add(
            f"Latency added p50, against a LiteLLM {peer.version} proxy in the same run",
            f"gpusched {added_p50:.2f} ms, LiteLLM {peer_p50:.2f} ms (through it"
            f" {pct(peer_ms, 50):.2f}); p99: gpusched {added_p99:.2f}, LiteLLM {peer_p99:.2f}",
            "≤ LiteLLM's",
            added_p50 <= peer_p50,
        )

    # Where the time goes, per call, from the client's clock, the simulator's
    # log and the job's timestamps (the database's now() at the start of the
    # submit, claim and finish transactions; one machine, one clock).
    job_ids = [c["job"] for c in through_calls if c["job"]]
    jobs = {job.pk: job for job in Job.objects.filter(pk__in=job_ids)}
    who = claimed_by(job_ids)
    direct_parts: dict[str, list[float]] = {"total": [], "to_sim": [], "at_sim": [], "back": []}
    for c in direct_calls:
        entry = entries.get(c["label"])
        if entry and entry["finished_at"]:
            direct_parts["total"].append(c["ms"])
            direct_parts["to_sim"].append((entry["received_at"] - c["t0"]) * 1000)
            direct_parts["at_sim"].append((entry["finished_at"] - entry["received_at"]) * 1000)
            direct_parts["back"].append((c["t1"] - entry["finished_at"]) * 1000)
    keys = ("total", "submit", "claim", "send", "to_sim", "at_sim", "finish", "answer", "back")
    columns: dict[str, dict[str, list[float]]] = {
        name: {key: [] for key in keys} for name in ("all", "web process", "dispatcher")
    }
    for c in through_calls:
        entry, job = entries.get(c["label"]), jobs.get(c["job"])
        if not (entry and entry["finished_at"] and job and job.started_at and job.finished_at):
            continue
        submitted, started = job.submitted_at.timestamp(), job.started_at.timestamp()
        finished = job.finished_at.timestamp()
        split = {
            "total": c["ms"],
            "submit": (submitted - c["t0"]) * 1000,
            "claim": (started - submitted) * 1000,
            "send": (entry["received_at"] - started) * 1000,
            "to_sim": (entry["received_at"] - c["t0"]) * 1000,
            "at_sim": (entry["finished_at"] - entry["received_at"]) * 1000,
            "finish": (finished - entry["finished_at"]) * 1000,
            "answer": (c["t1"] - finished) * 1000,
            "back": (c["t1"] - entry["finished_at"]) * 1000,
        }
        for name in ("all", who.get(job.pk, "dispatcher")):
            for key, value in split.items():
                columns[name][key].append(value)
    labels = {
        "total": "whole call (client)",
        "submit": "client sends → submit transaction begins (HTTP, ASGI, auth, parse)",
        "claim": "submit begins → claim begins (submit and its commit, then the claim's start)",
        "send": "claim begins → request at the simulator (claim, commit, grant, upstream send)",
        "to_sim": "**client sends → request at the simulator**",
        "at_sim": "at the simulator (received → answer written)",
        "finish": "answer written → finish begins (answer read)",
        "answer": "finish begins → client has the answer (finish, commit, relay, SDK)",
        "back": "**answer written → client has it**",
    }

    def cell(values: list[float]) -> str:
        return f"{pct(values, 50):.2f}" if values else "-"

    rows = []
    for key in keys:
        direct_cell = cell(direct_parts[key]) if key in direct_parts else ""
        row = " | ".join(cell(columns[name][key]) for name in columns)
        rows.append(f"| {labels[key]} | {row} | {direct_cell} |")
    count_row = " | ".join(str(len(columns[name]["total"])) for name in columns)
    report.sections += [
        "### Latency added",
        "",
        f"{calls} calls each way, alternating (after {WARMUP_CALLS} warm-up calls each):"
        f" `openai.OpenAI(...).chat.completions.with_raw_response.create(model={INSTANT!r},"
        " messages=[one user message], user=LABEL)`, the simulator answering at once; the"
        " front-door calls carry the member's key. Client-side time per call.",
        "",
        STATS_HEAD,
        stats_row("direct to the simulator", direct_ms),
        stats_row("through gpusched's front door", through_ms),
        *([stats_row(f"through a LiteLLM {peer.version} proxy", peer_ms)] if peer else []),
        "",
        "Where the time of a call goes, medians (ms). The split points are the client's"
        " clock, the simulator's log and the job's `submitted_at`, `started_at` and"
        " `finished_at` (the database's `now()`, the start of each transaction). *Web process*:"
        " the caller's web process claimed the job itself; *dispatcher*: the GPU cluster"
        " claimed it first and the web process learnt it by NOTIFY.",
        "",
        "| Part | through gpusched, all | claimed by the web process | claimed by the"
        " dispatcher | direct |",
        "|---|---:|---:|---:|---:|",
        *rows,
        f"| calls | {count_row} | {len(direct_parts['total'])} |",
        "",
        cpu_line(
            spent,
            calls,
            "front-door call (the direct calls cost these processes nothing"
            " but the simulator's share)",
        ),
        "",
    ]


# -- 2. the burst --------------------------------------------------------------------------


def overlaps(entries: list[dict[str, Any]]) -> tuple[int, int, float]:
    """Requests that arrived before the previous one ended (by the simulator's
    clock), refused ones (429: the simulator was busy), and the smallest gap (ms)."""
    ordered = sorted(entries, key=lambda entry: entry["received_at"])
    refused = sum(1 for entry in ordered if entry["status"] == 429)
    served = [entry for entry in ordered if entry["started_at"] is not None]
    early, smallest = 0, float("inf")
    for previous, entry in zip(served, served[1:], strict=False):
        gap = entry["received_at"] - (previous["finished_at"] or float("inf"))
        smallest = min(smallest, gap * 1000)
        early += gap < 0
    return early, refused, smallest


def burst_benchmark(
    report: Report, procs: Processes, web: subprocess.Popen, web_url: str, members: list[Any]
) -> None:
    from queueapp.models import Job

    args = report.args
    count = args.callers
    tokens = [token for _, token in members]
    member_ids = [member.pk for member, _ in members]
    sim_reset(procs.sim_url)
    time.sleep(0.5)
    rss_before = rss_kib(web.pid)
    with Sampler(procs.database_url, web.pid, web_url, member_ids) as sampler:
        time.sleep(0.5)  # a few health samples on the idle server first
        meter = CpuMeter(procs, web.pid)
        callers = Callers(
            procs.log_dir, "burst", url=web_url, tokens=tokens, model=BURST, count=count
        )
        try:
            outcome = callers.wait()
        finally:
            callers.stop()
        spent = meter.spent()
        time.sleep(0.3)
    rss_after = rss_kib(web.pid)
    results = outcome["results"]
    first = min(r["t0"] for r in results)
    last = max(r["t1"] for r in results)
    wall = last - first
    ideal = count * MODEL_SECONDS[BURST]
    errors = [r for r in results if r.get("status") != 200 or not r.get("ok")]
    statuses = Counter(r.get("status") for r in results)
    entries = [e for e in sim_log(procs.sim_url) if e["model"] == BURST]
    early, refused, smallest = overlaps(entries)
    served = [e for e in entries if e["status"] == 200]
    labels = Counter(label_of(e) for e in served)
    twice = sum(1 for n in labels.values() if n > 1)
    job_ids = [r["job"] for r in results if r.get("job")]
    jobs = {
        row[0]: row
        for row in Job.objects.filter(member_id__in=member_ids, model=BURST).values_list(
            "pk", "status", "submitted_at", "started_at", "finished_at", "error"
        )
    }
    job_states = Counter(row[1] for row in jobs.values())
    # A caller answered 200 whose job did not succeed: relayed under a claim
    # the database no longer holds (its lease expired before the call began).
    label_job = {r["label"]: r.get("job") for r in results}
    entry_of = {label_of(e): e for e in served}
    not_succeeded = [row for row in jobs.values() if row[1] != "succeeded"]
    job_entry = {label_job.get(label): e for label, e in entry_of.items()}
    relayed_anyway = [
        row
        for row in not_succeeded
        if row[0] in job_entry and row[4] and job_entry[row[0]]["received_at"] > row[4].timestamp()
    ]
    submit_ms, grant_ms = [], []
    for r in results:
        row, entry = jobs.get(r.get("job")), entry_of.get(r["label"])
        if row and row[2]:
            submit_ms.append((row[2].timestamp() - r["t0"]) * 1000)
        if row and row[3] and entry:
            grant_ms.append((entry["received_at"] - row[3].timestamp()) * 1000)
    ordered = sorted(served, key=lambda e: e["received_at"])
    first_request = (ordered[0]["received_at"] - first) if ordered else float("nan")
    gaps = harness.gaps_ms(served)
    busy = sum(e["finished_at"] - e["started_at"] for e in served)
    span = (
        max(e["finished_at"] for e in served) - min(e["received_at"] for e in served)
        if served
        else float("nan")
    )
    during = [(at, ms, st) for at, ms, st in sampler.health if first <= at <= last]
    health_ms = [ms for _, ms, _ in during]
    health_bad = sum(1 for _, _, st in during if st != 200)
    idle_health = [ms for at, ms, _ in sampler.health if at < first]
    burst_samples = [s for s in sampler.samples if first <= s.at <= last]
    peak = max(burst_samples, key=lambda s: s.callers_connected, default=None)
    rss_peak = max((s.rss_kib for s in burst_samples), default=rss_before)
    peak_waiting = max((s.waiting_jobs for s in burst_samples), default=0)
    peak_connected = peak.callers_connected if peak else 0
    per_caller = (rss_peak - rss_before) / peak_connected if peak_connected else float("nan")
    per_job = (rss_peak - rss_before) / peak_waiting if peak_waiting else float("nan")
    max_total = max((s.pg_total for s in burst_samples), default=0)
    max_active = max((s.pg_active for s in burst_samples), default=0)
    web_open = max((s.web_open for s in burst_samples), default=0)
    web_active = max((s.web_active for s in burst_samples), default=0)
    latencies = [(r["t1"] - r["t0"]) * 1000 for r in results if r.get("status") == 200]

    report.add(
        f"{count:,} concurrent callers of 20 ms jobs: errors (answers other than 200, jobs"
        " not succeeded)",
        f"{len(errors)} answers other than 200 ({dict(statuses)}); {len(not_succeeded)} jobs"
        f" not succeeded ({dict(job_states)})"
        + (
            f"; **{len(relayed_anyway)} of them sent to llama-swap (and answered 200) after"
            f" the job had ended: {', '.join(repr(row[5][:70]) for row in relayed_anyway[:2])}**"
            if relayed_anyway
            else ""
        ),
        "0",
        not errors and len(served) == count and not twice and not not_succeeded,
        check=True,
    )
    report.add(
        "… overlapping upstream requests",
        f"{early + refused}: {refused} arrived while another was being served (the simulator"
        f" refused them, 429), {early} served before the previous one ended; {len(served)}"
        f" requests served, {twice} twice; smallest gap between served ones {smallest:.2f} ms",
        "0",
        early == 0 and refused == 0,
        check=True,
    )
    report.add(
        "… wall time",
        f"{wall:.2f} s = {wall / ideal:.2f} × the ideal {ideal:g} s",
        f"≤ {WALL_GOAL_FACTOR:g} × ideal ({WALL_GOAL_FACTOR * ideal:g} s)",
        wall <= WALL_GOAL_FACTOR * ideal,
    )
    report.add(
        "… `GET /api/health/` every 50 ms during the burst, p99",
        f"{pct(health_ms, 99):.1f} ms (p50 {pct(health_ms, 50):.1f}, max "
        f"{max(health_ms, default=float('nan')):.1f}, {len(health_ms)} polls,"
        f" {health_bad} not 200)",
        f"< {HEALTH_P99_GOAL_MS:g} ms",
        bool(health_ms) and pct(health_ms, 99) < HEALTH_P99_GOAL_MS and not health_bad,
    )
    report.add(
        "… database connections during the burst (bench database)",
        f"max {max_total} open, {max_active} not idle; web process: max {web_open} open, "
        f"{web_active} not idle (pool {POOL} + 1 listener)",
        f"reported (pool GPUSCHED_DB_POOL={POOL})",
        None,
    )
    report.add(
        "… web process RSS growth per waiting caller",
        f"{per_caller:.1f} KiB ({(rss_peak - rss_before) / 1024:.1f} MiB over "
        f"{peak_connected} connected callers; {per_job:.1f} KiB per queued-or-running job, "
        f"peak {peak_waiting})",
        "reported",
        None,
    )
    report.sections += [
        "### Burst",
        "",
        f"{count:,} callers in one process (`AsyncOpenAI` + `asyncio.gather`, one shared"
        f" pool of {count + 10} connections (`openai.DefaultAsyncHttpxClient`),"
        f" {len(tokens)} members of tier `max`, one client each) call `{BURST}`"
        f" ({MODEL_SECONDS[BURST] * 1000:g} ms a job) through one"
        " web process. Wall: from the first call sent to the last answer (client clock).",
        "",
        STATS_HEAD,
        stats_row("caller latency (send → answer)", latencies),
        stats_row("`GET /api/health/` before the burst (idle)", idle_health),
        stats_row("`GET /api/health/` during the burst", health_ms),
        "",
        f"- Simulator: {len(served)} requests served, busy {busy:.2f} s of the {span:.2f} s"
        f" from the first request to the last answer ({busy / span * 100:.0f} %);"
        f" gap between requests p50 {pct(gaps, 50):.2f} ms, p99 {pct(gaps, 99):.2f} ms, max"
        f" {max(gaps, default=float('nan')):.0f} ms; the first request reached it"
        f" {first_request:.2f} s after the first call was sent.",
        f"- Caller sends → its job is submitted (`submitted_at`): p50 {pct(submit_ms, 50):.0f} ms,"
        f" max {max(submit_ms, default=float('nan')):.0f} ms. Job claimed (`started_at`) → its"
        f" request at the simulator: p50 {pct(grant_ms, 50):.1f} ms, p99 {pct(grant_ms, 99):.1f}"
        f" ms, max {max(grant_ms, default=float('nan')):.0f} ms.",
        f"- Claimed by: {claimers(job_ids)}.",
        f"- Web process RSS: {rss_before / 1024:.1f} MiB before, {rss_peak / 1024:.1f} MiB at"
        f" the peak, {rss_after / 1024:.1f} MiB after the burst. Peak of established caller"
        f" connections {peak_connected}, of the burst's jobs queued or running {peak_waiting}.",
        f"- Database connections to `{DATABASE}` ({len(burst_samples)} samples, every"
        f" {SAMPLE_INTERVAL_S * 1000:g} ms): max {max_total} (all processes: web, GPU cluster,"
        f" this script), of which max {max_active} not idle; the web process's own (matched by"
        f" client port through /proc): max {web_open} open, {web_active} not idle. The front"
        f" door's database executor has {POOL // 2} threads (half the pool).",
        f"- {cpu_line(spent, count, 'caller')}",
        "",
    ]


# -- 3. dispatch gaps ----------------------------------------------------------------------


def gap_series(report: Report, name: str, entries: list[dict[str, Any]], job_ids: list[int]):
    from queueapp.models import Job

    rows = list(
        Job.objects.filter(pk__in=job_ids)
        .order_by("started_at")
        .values_list("started_at", "finished_at")
    )
    gaps = harness.gaps_ms(entries)
    split = harness.gap_breakdown(name, rows, entries)
    return gaps, split


def gap_benchmarks(
    report: Report,
    procs: Processes,
    web: subprocess.Popen,
    web_url: str,
    member: Any,
    token: str,
) -> None:
    from queueapp.models import Job, JobStatus

    count = report.args.gap_jobs
    # Front door: `count` callers wait while dispatch is paused, then it resumes.
    harness.set_paused(True)
    callers = Callers(
        procs.log_dir, "gapfd", url=web_url, tokens=[token], model=INSTANT, count=count
    )
    try:

        def all_queued() -> bool:
            procs.check_alive()
            if callers.process.poll() is not None:
                raise RuntimeError(f"the callers' process ended early; see {callers.log_path}")
            return (
                Job.objects.filter(member=member, front_door=True, status=JobStatus.QUEUED).count()
                >= count
            )

        wait_for(
            all_queued,
            timeout=120,
            message=f"{count} front-door callers queued",
            interval=0.05,
        )
        sim_reset(procs.sim_url)
        meter = CpuMeter(procs, web.pid)
        harness.set_paused(False)
        outcome = callers.wait()
        fd_spent = meter.spent()
    finally:
        callers.stop()
    results = outcome["results"]
    bad = [r for r in results if r.get("status") != 200]
    fd_ids = [r["job"] for r in results if r.get("job")]
    fd_entries = [e for e in sim_log(procs.sim_url) if label_of(e).startswith("gapfd-")]
    fd_gaps, fd_split = gap_series(report, "front door", fd_entries, fd_ids)
    fd_by = claimers(fd_ids)

    # REST: the same number of jobs by POST /api/jobs/ while paused, then resumed.
    harness.set_paused(True)
    rest_ids = []
    with httpx.Client(
        base_url=web_url, timeout=60, headers={"Authorization": f"Bearer {token}"}
    ) as http:
        for index in range(count):
            body = {
                "model": INSTANT,
                "messages": [{"role": "user", "content": "front-door benchmark, REST"}],
                "user": f"gaprest-{index:05d}",
            }
            response = http.post("/api/jobs/", json={"path": "/v1/chat/completions", "body": body})
            if response.status_code != 201:
                raise RuntimeError(f"POST /api/jobs/: {response.status_code} {response.text[:300]}")
            rest_ids.append(response.json()["id"])
    sim_reset(procs.sim_url)
    meter = CpuMeter(procs, web.pid)
    harness.set_paused(False)

    def rest_done() -> bool:
        procs.check_alive()
        return not Job.objects.filter(
            pk__in=rest_ids, status__in=[JobStatus.QUEUED, JobStatus.RUNNING]
        ).exists()

    wait_for(rest_done, timeout=120, message=f"{count} REST jobs dispatched", interval=0.05)
    rest_spent = meter.spent()
    rest_states = Counter(Job.objects.filter(pk__in=rest_ids).values_list("status", flat=True))
    rest_entries = [e for e in sim_log(procs.sim_url) if label_of(e).startswith("gaprest-")]
    rest_gaps, rest_split = gap_series(report, "REST", rest_entries, rest_ids)

    p50 = pct(fd_gaps, 50)
    report.add(
        f"Front-door dispatch gap, backlog of {count} calls, p50",
        f"{p50:.2f} ms (p99 {pct(fd_gaps, 99):.2f}; REST backlog of {count}: p50 "
        f"{pct(rest_gaps, 50):.2f}, p99 {pct(rest_gaps, 99):.2f})",
        f"≤ {FRONT_DOOR_GAP_P50_GOAL_MS:g} ms (front door)",
        bool(fd_gaps) and p50 <= FRONT_DOOR_GAP_P50_GOAL_MS,
    )
    report.add(
        "… the gap measurements' calls and jobs",
        f"front door: {len(results) - len(bad)}/{count} answered 200, {len(fd_entries)} requests"
        f" at the simulator; REST: {dict(rest_states)}, {len(rest_entries)} requests",
        "all served once",
        not bad
        and len(fd_entries) == count
        and len(rest_entries) == count
        and rest_states == Counter({JobStatus.SUCCEEDED: count}),
        check=True,
    )
    report.sections += [
        "### Dispatch gap",
        "",
        f"Simulator idle time between two consecutive requests (`received_at` of one minus"
        f" `finished_at` of the one before), `{INSTANT}` answering at once. Front door:"
        f" dispatch paused, {count} callers (one process, AsyncOpenAI) wait, dispatch resumed."
        f" REST: dispatch paused, {count} jobs by `POST /api/jobs/`, resumed; the GPU cluster"
        " forwards them.",
        "",
        STATS_HEAD,
        stats_row("front-door backlog", fd_gaps),
        stats_row("REST backlog (`POST /api/jobs/`)", rest_gaps),
        "",
        "Split of a gap, medians (ms), at the jobs' `finished_at` and `started_at`:",
        "",
        "| Backlog | Answer sent → finish begins | Finish begins → claim begins"
        " | Claim begins → next request | Gaps split |",
        "|---|---:|---:|---:|---:|",
        *(
            f"| {s.name} | {harness.fmt_ms(s.answer_to_finish)}"
            f" | {harness.fmt_ms(s.finish_to_claim)}"
            f" | {harness.fmt_ms(s.claim_to_request)} | {s.matched} |"
            for s in (fd_split, rest_split)
        ),
        "",
        f"Front-door jobs claimed by: {fd_by}.",
        "",
        f"- Front door: {cpu_line(fd_spent, count, 'job, from the resume to the last answer')}",
        f"- REST: {cpu_line(rest_spent, count, 'job, from the resume to the last job ended')}",
        "",
    ]


# -- 4. SIGKILL of the web process ---------------------------------------------------------


def kill_benchmark(
    report: Report,
    procs: Processes,
    web: subprocess.Popen,
    web_url: str,
    member: Any,
    token: str,
) -> None:
    from openai import OpenAI

    from queueapp.models import Job, JobStatus

    waiting_goal = report.args.kill_callers
    # One more than the goal: queued while dispatch is paused, then dispatch
    # resumes, and the kill comes while the second job runs, so that exactly
    # the goal waits (one running, the rest queued).
    count = waiting_goal + 1
    _, second_url = procs.start_web()
    # The next caller's client, with its connection to the second server open
    # and that server's gateway listening (its first call starts it).
    after = OpenAI(base_url=f"{second_url}/v1", api_key=token, max_retries=0, timeout=60)
    after.chat.completions.create(
        model=INSTANT, messages=[{"role": "user", "content": "warm"}], user="warm-b"
    )
    harness.set_paused(True)
    callers = Callers(
        procs.log_dir, "kill", url=web_url, tokens=[token], model=SLOW, count=count, deadline=120.0
    )
    batch = Job.objects.filter(member=member, model=SLOW, front_door=True)
    try:

        def states() -> Counter:
            procs.check_alive()
            if callers.process.poll() is not None:
                raise RuntimeError(f"the callers' process ended early; see {callers.log_path}")
            return Counter(batch.values_list("status", flat=True))

        wait_for(
            lambda: states()[JobStatus.QUEUED] >= count,
            timeout=120,
            message=f"{count} callers queued",
            interval=0.05,
        )
        harness.set_paused(False)

        def second_running() -> bool:
            now = states()
            return now[JobStatus.SUCCEEDED] >= 1 and now[JobStatus.RUNNING] == 1

        wait_for(second_running, timeout=30, message="the second job running", interval=0.01)
        before = dict(batch.values_list("pk", "status"))
        t_kill = time.time()
        os.kill(web.pid, signal.SIGKILL)
        t_sent = time.time()
        raw = after.chat.completions.with_raw_response.create(
            model=SLOW,
            messages=[{"role": "user", "content": "after the kill"}],
            user="after-kill",
        )
        t_answer = time.time()
        after_status = raw.status_code
        after_job = int(raw.headers.get("x-gpusched-job-id") or 0)
        web.wait(timeout=10)
        outcome = callers.wait()
    finally:
        callers.stop()
        after.close()
    waiting_ids = [
        pk for pk, status in before.items() if status in (JobStatus.QUEUED, JobStatus.RUNNING)
    ]
    running_at_kill = [pk for pk in waiting_ids if before[pk] == JobStatus.RUNNING]

    def settled() -> bool:
        return not Job.objects.filter(
            pk__in=waiting_ids, status__in=[JobStatus.QUEUED, JobStatus.RUNNING]
        ).exists()

    try:
        wait_for(settled, timeout=15, message="the waiting jobs to end", interval=0.05)
    except TimeoutError as exc:
        report.notes.append(str(exc))
    settled_after = time.time() - t_kill
    rows = list(Job.objects.filter(pk__in=waiting_ids).values_list("pk", "status", "finished_at"))
    states = Counter(status for _, status, _ in rows)
    succeeded_after = [
        pk
        for pk, status, end in rows
        if status == JobStatus.SUCCEEDED and end and end.timestamp() > t_kill
    ]
    ran_after_wrongly = [pk for pk in succeeded_after if pk not in running_at_kill]
    queued_cancelled = sum(
        1
        for pk, status, _ in rows
        if before[pk] == JobStatus.QUEUED and status == JobStatus.CANCELLED
    )
    queued_at_kill = sum(1 for pk in waiting_ids if before[pk] == JobStatus.QUEUED)
    left = states[JobStatus.QUEUED] + states[JobStatus.RUNNING]
    entries = sorted(sim_log(procs.sim_url), key=lambda e: e["received_at"])
    mine = next((e for e in entries if label_of(e) == "after-kill"), None)
    # The job granted before the kill may have its request in the socket
    # already: it reaches the simulator just after; it was not granted after.
    granted_labels = {
        body.get("user")
        for body in Job.objects.filter(pk__in=running_at_kill).values_list("body", flat=True)
    }
    batch_after = [
        e
        for e in entries
        if label_of(e).startswith("kill-")
        and e["received_at"] > t_kill
        and label_of(e) not in granted_labels
    ]
    in_flight = [
        e
        for e in entries
        if e["received_at"] <= t_kill and (e["finished_at"] is None or e["finished_at"] >= t_kill)
    ]
    if mine is None:
        lost = idle = float("nan")
    else:
        lost = mine["received_at"] - t_kill
        previous = [
            e["finished_at"]
            for e in entries
            if e["received_at"] < mine["received_at"] and e["finished_at"]
        ]
        idle = mine["received_at"] - max(previous) if previous else float("nan")
    after_state = Job.objects.filter(pk=after_job).values_list("status", flat=True).first()
    answers = Counter(r.get("status") for r in outcome["results"])

    report.add(
        f"SIGKILL with {len(waiting_ids)} callers waiting: kill → next caller's request at the"
        " simulator",
        f"{lost:.3f} s (simulator idle {idle:.3f} s; the next caller's answer after"
        f" {t_answer - t_sent:.3f} s)",
        f"≤ {KILL_LOST_GOAL_S:g} s",
        lost <= KILL_LOST_GOAL_S,
    )
    report.add(
        "… the waiting jobs",
        f"{queued_cancelled} of {queued_at_kill} queued cancelled; running at the kill"
        f" {len(running_at_kill)} → {[s for pk, s, _ in rows if pk in running_at_kill]};"
        f" by status {dict(states)}; left queued/running {left}; succeeded after the kill"
        f" {len(succeeded_after)}; requests of the batch at the simulator after the kill"
        f" {len(batch_after)}",
        "every queued one cancelled, none run after the kill",
        queued_cancelled == queued_at_kill
        and left == 0
        and not ran_after_wrongly
        and not batch_after,
        check=True,
    )
    report.add(
        "… the next caller (through the second web process)",
        f"answered {after_status}, job {after_state}",
        "served",
        after_status == 200 and after_state == JobStatus.SUCCEEDED,
        check=True,
    )
    report.sections += [
        "### SIGKILL of the web process",
        "",
        f"{count} callers (one process, AsyncOpenAI) call `{SLOW}`"
        f" ({MODEL_SECONDS[SLOW] * 1000:g} ms a job) through web process A, queued while"
        " dispatch is paused; dispatch resumes, and while the second job runs A gets SIGKILL"
        f" ({waiting_goal} callers waiting); at once one more"
        " caller of the same member and model calls through web process B (already running,"
        " its connection open). Times from the client's clock and the simulator's log.",
        "",
        f"- Waiting at the kill: {queued_at_kill} queued, {len(running_at_kill)} running.",
        "- The request in flight at the kill: "
        + (
            ", ".join(
                f"status {e['status']}, ended {((e['finished_at'] or t_kill) - t_kill) * 1000:.0f}"
                " ms after the kill"
                for e in in_flight
            )
            or "none"
        )
        + ".",
        f"- Kill → the next caller's request at the simulator: {lost * 1000:.0f} ms; the"
        f" simulator stood idle {idle * 1000:.0f} ms; the caller had its answer"
        f" {(t_answer - t_kill) * 1000:.0f} ms after the kill.",
        f"- Every waiting job had ended {settled_after:.2f} s after the kill: {dict(states)}.",
        f"- The callers of A saw: {dict(answers)} (0: the connection broke).",
        "",
    ]


# -- logs, doc, main -----------------------------------------------------------------------


PROBLEM = re.compile(r"Traceback|\bWARNING\b|\bERROR\b|\bCRITICAL\b|[Ee]xception")
TIMESTAMP = re.compile(r"^[\d-]+ [\d:,]+ ")


def log_problems(log_dir: Path) -> list[str]:
    """Per log, how many lines look like trouble, and the first few distinct ones."""
    lines = []
    for path in sorted(log_dir.glob("*.log")):
        if path.name.startswith("simulator"):
            continue
        hits = [
            TIMESTAMP.sub("", line.strip())
            for line in path.read_text(errors="replace").splitlines()
            if PROBLEM.search(line)
        ]
        if hits:
            distinct = list(dict.fromkeys(re.sub(r"\d+", "N", hit)[:160] for hit in hits))
            shown = "; ".join(f"`{hit}`" for hit in distinct[:3])
            lines.append(f"`{path.name}`: {len(hits)} lines ({len(distinct)} distinct): {shown}")
    return lines


def other_activity() -> str:
    """Other test suites and benchmarks running on the machine now."""
    mine = {os.getpid(), os.getppid()}
    found = Counter()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in mine:
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "pytest" in cmd:
            found["pytest"] += 1
        elif "benchmarks/" in cmd and "frontdoor.py" not in cmd:
            found["other benchmarks"] += 1
        elif "gpusched.serve" in cmd and DATABASE not in cmd:
            found["daphne"] += 1
    return ", ".join(f"{n} {what}" for what, n in found.items()) or "none seen"


def section(report: Report) -> str:
    args = report.args
    machine = {
        **report.machine,
        "Load average at end (1/5/15 min)": " / ".join(f"{v:.2f}" for v in os.getloadavg()),
        "Other processes at end (pytest, daphne, benchmarks)": other_activity(),
    }
    rows = [
        f"| {f.name} | {f.measured} | {f.goal} | "
        f"{ {True: 'yes', False: '**no**', None: '-'}[f.met] } |"
        for f in report.figures
    ]
    out = [
        f"Run on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; the whole run took"
        f" {time.monotonic() - report.started:.0f} s:",
        "",
        "```sh",
        f".venv/bin/python benchmarks/frontdoor.py --latency-calls {args.latency_calls}"
        f" --callers {args.callers} --burst-members {args.burst_members}"
        f" --kill-callers {args.kill_callers} --gap-jobs {args.gap_jobs}",
        "```",
        "",
        "| | |",
        "|---|---|",
        *(f"| {key} | {value} |" for key, value in machine.items()),
        "",
        "| Figure | Measured | Goal | Met |",
        "|---|---|---|---|",
        *rows,
        "",
        *report.sections,
    ]
    problems = log_problems(report.log_dir) if report.log_dir else []
    out += [
        "### Server logs",
        "",
        f"Daphne's listen backlog as the kernel reports it: {report.backlog}."
        " Lines with Traceback, WARNING, ERROR, CRITICAL or exception in the logs of the web"
        " processes,"
        " the GPU cluster and the callers' processes: " + ("none." if not problems else ""),
        "",
        *(f"- {line}" for line in problems),
        *(f"- Note: {note}" for note in report.notes),
        "",
    ]
    return "\n".join(out).rstrip() + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--latency-calls", type=int, default=200)
    parser.add_argument("--callers", type=int, default=1000, help="the burst's callers")
    parser.add_argument("--burst-members", type=int, default=4, help="members of tier max")
    parser.add_argument("--kill-callers", type=int, default=100, help="waiting at the SIGKILL")
    parser.add_argument("--gap-jobs", type=int, default=200, help="jobs per gap backlog")
    parser.add_argument(
        "--no-litellm",
        dest="litellm",
        action="store_false",
        help="skip the LiteLLM proxy measured beside gpusched (.venv-litellm/)",
    )
    parser.add_argument("--no-doc", dest="doc", action="store_false", help="leave the doc alone")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    if argv is None and len(sys.argv) == 3 and sys.argv[1] == "--callers":
        return callers_process(sys.argv[2])
    args = parse_args(argv)
    report = Report(args)
    activity = other_activity()
    database_url = harness.fresh_database(DATABASE)
    report.machine = harness.machine_info()
    report.machine["Other processes at start (pytest, daphne, benchmarks)"] = activity
    report.machine["Code measured (git)"] = source_state()
    commits = commit_latency(database_url)
    report.machine["One-row INSERT + COMMIT on this server, p50 / p99"] = (
        f"{pct(commits, 50):.2f} / {pct(commits, 99):.2f} ms"
    )
    # Django's logging set-up (in fresh_database) leaves the clients' request lines on.
    for name in ("httpx", "httpx2", "openai"):
        logging.getLogger(name).setLevel(logging.WARNING)
    from django.db import connection

    from queueapp.models import Tier
    from queueapp.services import member_create

    tier = Tier.objects.get(name="max")
    # Room for every caller of the burst in one member's queue too.
    Tier.objects.filter(pk=tier.pk).update(max_queued_jobs=max(1000, args.callers + 10))
    tier.refresh_from_db()
    burst_members = [member_create(name=f"burst-{n}", tier=tier) for n in range(args.burst_members)]
    latency_member = member_create(name="latency", tier=tier)
    gap_member = member_create(name="gap", tier=tier)
    kill_member = member_create(name="kill", tier=tier)
    connection.close()

    log_dir = Path(tempfile.mkdtemp(prefix="gpusched-bench-frontdoor-"))
    report.log_dir = log_dir
    print(f"logs: {log_dir}", flush=True)
    procs = Processes(Stack(database_url=database_url, log_dir=log_dir))

    def phase(name: str, function: Any, *fargs: Any) -> None:
        print(name, flush=True)
        start = time.monotonic()
        function(*fargs)
        report.timings.append((name, time.monotonic() - start))
        connection.close()

    try:
        procs.start_simulator()
        procs.start_cluster()
        web, web_url = procs.start_web()
        report.backlog = procs.backlog_seen
        peer = None
        if args.litellm:
            peer = LiteLlmProxy.start(
                upstream=f"{procs.sim_url}/v1", models=[INSTANT], log_dir=log_dir
            )
        try:
            phase(
                "latency added",
                latency_benchmark,
                report,
                procs,
                web,
                web_url,
                latency_member[1],
                peer,
            )
        finally:
            if peer is not None:
                peer.stop()
        phase("burst", burst_benchmark, report, procs, web, web_url, burst_members)
        phase("dispatch gaps", gap_benchmarks, report, procs, web, web_url, *gap_member)
        phase("SIGKILL", kill_benchmark, report, procs, web, web_url, *kill_member)
    except Exception:
        if procs.cluster is not None:
            print(f"cluster log tail:\n{procs.cluster.tail()}", file=sys.stderr)
        print(f"logs: {log_dir}", file=sys.stderr)
        raise
    finally:
        procs.stop()
    text = section(report)
    print()
    print(text)
    print(f"logs: {log_dir}")
    if args.doc:
        harness.write_between_markers(DOC_PATH, START, END, heading="## Front door", text=text)
    return 0 if report.checks_ok else 1


if __name__ == "__main__":
    sys.exit(main())
