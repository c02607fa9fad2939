"""The running system as the end-to-end tests and the benchmarks start it: the
GPU cluster (`manage.py qcluster`), the web server (Daphne) and the llama-swap
simulator, each a process of its own on one database.

Why the design holds:

- Each process runs in a session of its own, so a stop or a kill reaches the
  whole process group (django-q2 forks a sentinel, workers and a pusher) and a
  Ctrl-C in the terminal reaches only the test runner, which then stops them.
- A start returns once the process is ready, never after a fixed time: the web
  server and the simulator answer their health URL, and a GPU cluster has a
  dispatch pass listening on the work channel of its database, so the first
  job is not timed against the cluster's start-up.
- A stop is the process's own graceful signal to its group (SIGINT for a
  cluster, as Ctrl-C and `make run` give it: the worker finishes its job and
  claims no other; SIGTERM for the others), then SIGKILL after a deadline.
- Every process appends its output to a log file in the stack's folder; a
  process that exits early fails the wait with the end of its log.
- A process runs from a checkout, this one unless a `root` is given (an
  upgrade test's next release): its folder is the working directory and the
  head of PYTHONPATH, so the code imported is that checkout's, whatever
  the virtual environment's editable install points at.

The product never imports this module (`run_all` starts the same commands on
its own, for an operator). It lives in gpusched/ rather than tests/ so that
benchmarks/ need not import the tests, and its `wait_for` is the one wait
with a deadline that the suite and the benchmarks use. It imports no Django
at import time, so a benchmark can create and choose its database before it
sets Django up.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import httpx
import psycopg

from gpusched.server_limits import daphne_command
from gpusched.upstreams import DEFAULT_UPSTREAM, parse_upstreams

ROOT = Path(__file__).resolve().parent.parent
READY_SECONDS = 30.0
STOP_SECONDS = 15.0
POLL_SECONDS = 0.01
# The dispatch pass polls this often when no notification wakes it; short, so
# a test's waits end soon after the state they wait for.
QUEUE_POLL_SECONDS = "0.05"
# GPUSCHED_DB_POOL of the web server, as `make run` starts it (run_all).
WEB_DB_POOL = "20"
WEBHOOK_CLUSTER = "webhooks"

T = TypeVar("T")


def wait_for(
    predicate: Callable[[], T],
    *,
    timeout: float = READY_SECONDS,
    message: str = "the condition",
    interval: float = POLL_SECONDS,
) -> T:
    """Poll until `predicate()` is truthy and return its value; raise
    TimeoutError naming `message` once `timeout` seconds have passed."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {message}")
        time.sleep(interval)  # between checks of the state, up to the deadline


# Where the test suite runs in several workers at once (pytest-xdist), each
# worker hands out ports from a range of its own, "FIRST-LAST", set in this
# variable (tests/conftest.py): a port handed out is only bound a moment
# later, by the process it is for, and in that moment another worker's
# bind(0) could be given the same one, and its test talk to the wrong server.
PORT_RANGE_VARIABLE = "GPUSCHED_TEST_PORTS"
_ports_handed_out = 0


def free_port() -> int:
    """A port free on 127.0.0.1 now; the process that gets it binds it right after."""
    return free_consecutive_ports(1)


def free_consecutive_ports(count: int) -> int:
    """The first of `count` consecutive ports free on 127.0.0.1 now, as
    run_all's simulators take them. The port after a free one may be busy:
    Linux gives bind(0) odd ports and outgoing connections even ones."""
    for _ in range(1000):
        first = _next_candidate(count)
        with contextlib.ExitStack() as held:
            try:
                for port in range(first, first + count):
                    probe = held.enter_context(socket.socket())
                    probe.bind(("127.0.0.1", port))
            except OSError:
                continue  # one of them is taken: try another run
            return first
    raise RuntimeError(f"no {count} consecutive free ports on 127.0.0.1")


def _next_candidate(count: int) -> int:
    """Where to look for `count` free ports: where bind(0) says, or the next
    ports of this process's range, in turn from a place of its own (a child
    that hands out ports too starts elsewhere)."""
    port_range = os.environ.get(PORT_RANGE_VARIABLE, "")
    if not port_range:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            first = int(probe.getsockname()[1])
        return first if first + count <= 65536 else _next_candidate(count)
    global _ports_handed_out
    low, high = (int(bound) for bound in port_range.split("-"))
    size = high - low + 1
    place = (os.getpid() * 37 + _ports_handed_out) % size
    if place + count > size:  # the run would pass the range's end: start over at its low end
        _ports_handed_out += size - place
        place = 0
    _ports_handed_out += count
    return low + place


def dispatcher_listening(database_url: str, gpu: str) -> bool:
    """Whether GPU `gpu`'s dispatch pass, on `database_url`'s database,
    holds its dispatcher lock and listens on the work channel
    (queueapp/dispatch/wakeup.py)."""
    from queueapp.dispatch.wakeup import WORK_CHANNEL
    from queueapp.locks import DISPATCHER_LOCK_CLASS

    with psycopg.connect(database_url, autocommit=True) as probe:
        row = probe.execute(
            """
            SELECT count(*) FROM pg_locks AS lock
              JOIN pg_stat_activity AS session ON session.pid = lock.pid
              JOIN queueapp_gpu AS gpu ON gpu.id = lock.objid::bigint
             WHERE lock.locktype = 'advisory' AND lock.classid = %s AND lock.objsubid = 2
               AND lock.granted AND session.datname = current_database()
               AND session.query = %s AND gpu.name = %s
            """,
            [DISPATCHER_LOCK_CLASS, f"LISTEN {WORK_CHANNEL}", gpu],
        ).fetchone()
    return bool(row and row[0])


class Process:
    """One command in a session of its own, run in `root` (a checkout), its
    output appended to `log_path`."""

    name = "process"
    stop_signal = signal.SIGTERM

    def __init__(
        self, argv: list[str], *, env: Mapping[str, str], log_path: Path, root: Path = ROOT
    ) -> None:
        self.argv = argv
        self.env = dict(env)
        self.log_path = log_path
        self.root = root
        self.process: subprocess.Popen[bytes] | None = None
        self.killed = False

    @property
    def pid(self) -> int:
        assert self.process is not None, f"{self.name} was never started"
        return self.process.pid

    def start(self) -> Process:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.argv,
                cwd=self.root,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.wait_ready()
        return self

    def wait_ready(self) -> None:
        """Return once the process does its work; the default: once it runs."""
        self.check_alive()

    def is_running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def check_alive(self) -> None:
        """Raise, with the end of the log, if the process has exited unasked."""
        if self.process is not None and not self.killed and self.process.poll() is not None:
            raise RuntimeError(
                f"{self.name} exited with {self.process.returncode} (log: {self.log_path})\n"
                f"{self.tail()}"
            )

    def kill(self) -> None:
        """SIGKILL the whole process group: no cleanup, as in a crash."""
        assert self.process is not None
        self.killed = True
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self, timeout: float = STOP_SECONDS) -> None:
        """The graceful signal to the group; SIGKILL if it is still there
        `timeout` seconds later, and for whatever of the group outlived its
        leader."""
        if self.process is None:
            return
        if self.is_running():
            try:
                os.killpg(self.process.pid, self.stop_signal)
                self.process.wait(timeout=timeout)
            except ProcessLookupError:
                pass
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
        # A worker that outlived its leader (which crashed, or exited without
        # waiting for it) would go on using the database the next user of it
        # gets: the next test's, say.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def _answers(self, url: str, statuses: tuple[int, ...] = (200,)) -> bool:
        """`url` answers with one of `statuses`; raises if the process has exited."""
        self.check_alive()
        try:
            # A pooled web server waits up to the pool's 5 s for a connection
            # before it answers 503.
            return httpx.get(url, timeout=10).status_code in statuses
        except httpx.TransportError:
            return False


class GpuCluster(Process):
    """`manage.py qcluster`: the dispatcher (or, named so, the webhook cluster)."""

    name = "the GPU cluster"
    # As Ctrl-C would: the main process stops the cluster in order and the
    # worker's dispatch pass stops claiming (see queueapp/dispatch/wakeup.py).
    stop_signal = signal.SIGINT

    def __init__(
        self, *, database_url: str, env: Mapping[str, str], log_path: Path, root: Path = ROOT
    ) -> None:
        argv = [sys.executable, "manage.py", "qcluster"]
        super().__init__(argv, env=env, log_path=log_path, root=root)
        self.database_url = database_url
        self.dispatches = env.get("Q_CLUSTER_NAME", "") != WEBHOOK_CLUSTER
        # The GPU it dispatches for (gpusched/settings.py: GPUSCHED_GPU, else
        # LLAMA_SWAP_URL's first).
        self.gpu = (
            env.get("GPUSCHED_GPU")
            or parse_upstreams(env.get("LLAMA_SWAP_URL") or DEFAULT_UPSTREAM)[0].name
        )

    def wait_ready(self) -> None:
        if not self.dispatches:
            self.check_alive()
            return

        # A second cluster of one GPU starts no pass of its own while the
        # first one's runs: any pass of the GPU listening means it is served.
        def listening() -> bool:
            self.check_alive()
            return dispatcher_listening(self.database_url, self.gpu)

        wait_for(listening, message=f"{self.gpu}'s dispatch pass to listen for work", interval=0.02)


class WebServer(Process):
    """Daphne serving the app (HTTP and WebSocket), as `make run` serves it."""

    name = "the web server"

    def __init__(
        self,
        *,
        env: Mapping[str, str],
        log_path: Path,
        access_log: bool,
        healthy: bool,
        port: int | None = None,
        root: Path = ROOT,
    ) -> None:
        self.port = port or free_port()
        # A server without its database answers /api/health/ with 503.
        self.ready_statuses = (200,) if healthy else (200, 503)
        self.url = f"http://127.0.0.1:{self.port}"
        argv = daphne_command(sys.executable, port=self.port, access_log=access_log)
        super().__init__(argv, env=env, log_path=log_path, root=root)

    def wait_ready(self) -> None:
        wait_for(
            lambda: self._answers(f"{self.url}/api/health/", self.ready_statuses),
            timeout=60,  # several servers starting at once share the cores
            message=f"the web server on port {self.port}",
            interval=0.05,
        )


class SimulatorProcess(Process):
    """`python -m queueapp.upstream.simulator`: llama-swap as a process of its own.

    `log()` and `reset_log()` read and clear its request log over HTTP, as the
    in-process `LlamaSwapSimulator` does in memory."""

    name = "the llama-swap simulator"

    def __init__(
        self,
        *,
        env: Mapping[str, str],
        log_path: Path,
        models: Mapping[str, float],
        default_seconds: float,
        swap_seconds: float,
        accept_any_model: bool,
        parallel_models: Mapping[str, int] | None = None,
        api_keys: Sequence[str] = (),
        config: Path | None = None,
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [sys.executable, "-m", "queueapp.upstream.simulator", "--port", str(self.port)]
        argv += ["--swap-seconds", f"{swap_seconds:g}", "--default-seconds", f"{default_seconds:g}"]
        for model, seconds in models.items():
            argv += ["--model", f"{model}={seconds:g}"]
        if accept_any_model:
            argv.append("--accept-any-model")
        for model, slots in (parallel_models or {}).items():
            argv += ["--model-parallel", f"{model}={slots}"]
        for key in api_keys:  # llama-swap's apiKeys
            argv += ["--api-key", key]
        if config is not None:  # llama-swap's config: its models and routing
            argv += ["--config", str(config)]
        super().__init__(argv, env=env, log_path=log_path)

    def wait_ready(self) -> None:
        wait_for(
            lambda: self._answers(f"{self.url}/health"),
            message="the llama-swap simulator",
            interval=0.05,
        )

    def log(self) -> list[dict[str, Any]]:
        response = httpx.get(f"{self.url}/sim/log", timeout=30)
        response.raise_for_status()
        entries: list[dict[str, Any]] = response.json()
        return entries

    def reset_log(self) -> None:
        httpx.post(f"{self.url}/sim/reset", timeout=10).raise_for_status()


class Stack:
    """The processes of one test or benchmark on one database, logging to one
    folder; `stop()` (or leaving `with Stack(...)`) ends every one of them.

    `upstream_url` is llama-swap for the clusters and web servers (the
    simulator's URL once `start_simulator` has run); `env` is added to every
    process's environment, and each `start_*` call's keywords to that one's.
    """

    def __init__(
        self,
        *,
        database_url: str,
        log_dir: Path,
        upstream_url: str | None = None,
        media_root: Path | None = None,
        access_log: bool = False,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.database_url = database_url
        self.log_dir = log_dir
        self.upstream_url = upstream_url
        self.media_root = media_root
        self.access_log = access_log
        self.env = dict(env or {})
        self.clusters: list[GpuCluster] = []
        self.servers: list[WebServer] = []
        self.simulators: list[SimulatorProcess] = []
        log_dir.mkdir(parents=True, exist_ok=True)

    def _env(
        self, upstream_url: str | None, extra: Mapping[str, str], root: Path = ROOT
    ) -> dict[str, str]:
        env = dict(os.environ, DATABASE_URL=self.database_url, PYTHONUNBUFFERED="1")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
        upstream = upstream_url or self.upstream_url
        if upstream:
            env["LLAMA_SWAP_URL"] = upstream
        if self.media_root is not None:
            env["GPUSCHED_MEDIA_ROOT"] = str(self.media_root)
        env.update(self.env)
        env.update(extra)
        return env

    def start_simulator(
        self,
        *,
        models: Mapping[str, float],
        default_seconds: float = 0.0,
        swap_seconds: float = 0.0,
        accept_any_model: bool = False,
        parallel_models: Mapping[str, int] | None = None,
        api_keys: Sequence[str] = (),
        config: Path | None = None,
    ) -> SimulatorProcess:
        """`parallel_models`: requests of each it answers at once (a batching
        server); `api_keys`: llama-swap's `apiKeys`, one of which every call
        but `/health` then needs (the clusters and web servers send theirs
        from LLAMA_SWAP_API_KEY in `env`); `config`: a llama-swap config
        file whose models and routing it serves (the clusters read it from
        LLAMA_SWAP_CONFIG in `env`)."""
        simulator = SimulatorProcess(
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
            log_path=self.log_dir / f"simulator-{len(self.simulators)}.log",
            models=models,
            default_seconds=default_seconds,
            swap_seconds=swap_seconds,
            accept_any_model=accept_any_model,
            parallel_models=parallel_models,
            api_keys=api_keys,
            config=config,
        )
        self.simulators.append(simulator)
        simulator.start()
        if self.upstream_url is None:
            self.upstream_url = simulator.url
        return simulator

    def start_cluster(
        self, upstream_url: str | None = None, *, root: Path = ROOT, **env: str
    ) -> GpuCluster:
        """A GPU's dispatcher cluster (GPUSCHED_GPU names it among several
        LLAMA_SWAP_URL entries), returned once its dispatch pass listens for
        work; or, with Q_CLUSTER_NAME="webhooks", the webhook cluster. It
        runs the code of the checkout `root`."""
        full_env = {"GPUSCHED_QUEUE_POLL": QUEUE_POLL_SECONDS, **env}
        cluster = GpuCluster(
            database_url=env.get("DATABASE_URL") or self.database_url,
            env=self._env(upstream_url, full_env, root),
            log_path=self.log_dir / f"cluster-{len(self.clusters)}.log",
            root=root,
        )
        self.clusters.append(cluster)
        cluster.start()
        return cluster

    def start_web(
        self,
        upstream_url: str | None = None,
        *,
        healthy: bool = True,
        port: int | None = None,
        root: Path = ROOT,
        **env: str,
    ) -> WebServer:
        """A web server running the checkout `root` on `port` (a restart's is
        the one it replaces, as a proxy names it; by default a free one),
        returned once /api/health/ answers 200 (or, with `healthy=False`,
        once it answers at all: its database may be away)."""
        server = WebServer(
            env=self._env(upstream_url, {"GPUSCHED_DB_POOL": WEB_DB_POOL, **env}, root),
            log_path=self.log_dir / f"web-{len(self.servers)}.log",
            access_log=self.access_log,
            healthy=healthy,
            port=port,
            root=root,
        )
        self.servers.append(server)
        server.start()
        return server

    def manage(self, *args: str, root: Path = ROOT) -> None:
        """`manage.py ARGS` (e.g. `migrate`) of the checkout `root` on the
        stack's database, run to its end; raises, naming its log, on a failure."""
        log_path = self.log_dir / "manage.log"
        with log_path.open("ab") as log:
            argv = [sys.executable, "manage.py", *args]
            env = self._env(None, {}, root)
            code = subprocess.call(argv, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
        if code:
            raise RuntimeError(f"manage.py {' '.join(args)} exited with {code} (log: {log_path})")

    def processes(self) -> list[Process]:
        return [*self.servers, *self.clusters, *self.simulators]

    def check_alive(self) -> None:
        """Raise if a process this stack started has exited without being killed."""
        for process in self.processes():
            process.check_alive()

    def stop(self) -> None:
        """Web servers first, so no request finds a stopped cluster; the simulator last."""
        for process in self.processes():
            process.stop()

    def __enter__(self) -> Stack:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
