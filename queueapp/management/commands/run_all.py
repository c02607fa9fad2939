"""`make run`: the whole system in one terminal; Ctrl-C stops all of it.

It registers every GPU of LLAMA_SWAP_URL (or of the SIMULATED_GPUS simulators
it starts) and starts a dispatcher cluster per GPU (GPUSCHED_GPU set), one
web server and one webhook cluster; on several machines `manage.py
dispatcher` does the same for one GPU.

Each child runs in a session of its own, so Ctrl-C reaches only this
command, which stops each child with one signal (a second one in the middle
of django-q2's shutdown makes it hang): SIGINT to a cluster's whole process
group, as Ctrl-C in its own terminal would give it, so its worker finishes
the job in flight and claims no other; SIGTERM to the rest.

The stop goes in order, each step once the one before has ended: the
clusters, and the web server once the front-door calls it relays itself
have ended, then the simulators, then the embedded PostgreSQL. A job in
flight thus ends against a llama-swap that still answers, and a job claimed
in the commit that ended the last one goes back to the queue unsent
(queueapp/dispatch/loop.py): the stop fails no job. A
dispatcher gets GPUSCHED_STOP_SECONDS to finish its job; past that, or at a
second Ctrl-C, what still runs is killed, and its job is re-queued by its
lease at the next start. gpusched/watchdog.py covers this command dying
without its `finally`. The terminal shows one `gpusched.activity` line per
job; the decisions' JSON lines go to var/decisions.jsonl. Everything the
terminal shows is also in var/run.log, which goes on when the terminal has
gone (`make run | tee` and a Ctrl-C: gpusched/terminal.py).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser, OutputWrapper
from django.db import DatabaseError

from gpusched import embedded_db
from gpusched.server_limits import daphne_command
from gpusched.terminal import TerminalAndLog
from gpusched.upstreams import Upstream, UpstreamListInvalid, default_gpu_name, parse_upstreams
from gpusched.watchdog import Watchdog, die_with_parent
from queueapp import services
from queueapp.management.demo_token import demo_token_kept
from queueapp.models import Gpu, Job, JobStatus, Tier

# Models the built-in simulator serves, with seconds per job: a quick chat
# model, an image model and a video model, so swaps and long jobs show.
DEMO_MODELS = ["chat-small=1", "image-xl=8", "video-wan=30"]
DECISION_LOG = "decisions.jsonl"  # under the var folder (GPUSCHED_VAR_DIR)
RUN_LOG = "run.log"  # what the terminal shows, kept there too
# Simulators `make run` starts at most (SIMULATED_GPUS), one port each.
MAX_SIMULATED_GPUS = 16
# How long the web server may take to answer its health check after the start.
READY_SECONDS = 60
# How long a simulator, or anything after a second Ctrl-C, may take to stop
# before it is killed.
STOP_SECONDS = 15.0


def _database_ready() -> None:
    """Migrated, and on the first run only seeded from fixtures/: later runs
    keep what the operator changed."""
    call_command("migrate", verbosity=0)
    if not Tier.objects.exists():
        # queueapp/fixtures/, which the wheel carries too.
        call_command("loaddata", "tiers", "policy", verbosity=0)


def _children_env(port: int) -> dict[str, str]:
    """The environment each child starts with (some get a variable more)."""
    env = dict(os.environ, DATABASE_URL=settings.DATABASE_URL, PYTHONUNBUFFERED="1")
    # The webhook cluster builds absolute links from it (GPUSCHED_PUBLIC_URL).
    env.setdefault("GPUSCHED_PUBLIC_URL", f"http://127.0.0.1:{port}")
    # The terminal shows one line per job (gpusched.activity); the decisions'
    # JSON lines go to a file, where they can be kept and searched.
    if not env.get("GPUSCHED_DECISION_LOG"):
        decision_log = Path(settings.VAR_DIR, DECISION_LOG)
        decision_log.parent.mkdir(parents=True, exist_ok=True)
        env["GPUSCHED_DECISION_LOG"] = str(decision_log)
    env.setdefault("GPUSCHED_DECISION_LOG_CONSOLE", "0")
    return env


@dataclass
class _Children:
    """The processes run_all started, in the order started and stopped.

    Children run in their own sessions so that Ctrl-C reaches only this
    process, which then stops each of them once, in order (a second signal
    in the middle of django-q2's shutdown makes it hang). The watchdog stops
    them should this process die any other way (gpusched/watchdog.py)."""

    env: dict[str, str]
    watchdog: Watchdog
    preexec_fn: Callable[[], None] | None
    # Where their output goes: never the terminal itself, which may close
    # before they have ended (gpusched/terminal.py).
    output: TerminalAndLog
    started: list[tuple[str, subprocess.Popen]] = field(default_factory=list)
    # Stopped once the others have stopped: the llama-swap simulators.
    upstreams: list[tuple[str, subprocess.Popen]] = field(default_factory=list)

    def spawn(self, name: str, argv: list[str], *, upstream: bool = False, **kwargs: Any) -> None:
        kwargs.setdefault("env", self.env)
        quiet = kwargs.get("stdout") == subprocess.DEVNULL  # only its errors are shown
        if quiet:
            kwargs["stderr"] = subprocess.PIPE
        else:
            kwargs.update(stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        child = subprocess.Popen(argv, start_new_session=True, preexec_fn=self.preexec_fn, **kwargs)
        self.watchdog.guard(child.pid)  # a new session's process group has the leader's id
        printed = child.stderr if quiet else child.stdout
        assert printed is not None  # a pipe, asked for above
        self.output.relay(printed, error=quiet)
        self.started.append((name, child))
        if upstream:
            self.upstreams.append((name, child))


class Command(BaseCommand):
    help = (
        "Start the web server, a dispatcher cluster per GPU and (without LLAMA_SWAP_URL) "
        "SIMULATED_GPUS simulators."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
        parser.add_argument(
            "--simulator-port", type=int, default=int(os.environ.get("SIMULATOR_PORT", "9292"))
        )

    def handle(self, *args: object, port: int, simulator_port: int, **options: object) -> None:
        output = TerminalAndLog(Path(settings.VAR_DIR, RUN_LOG))
        self.stdout = OutputWrapper(output.stream())
        self.stderr = OutputWrapper(output.stream(error=True))
        self.stderr.style_func = self.style.ERROR
        _database_ready()
        token = demo_token_kept()
        admin_password = self._admin_password()
        env = _children_env(port)
        children = _Children(
            env=env, watchdog=Watchdog.start(), preexec_fn=die_with_parent(), output=output
        )
        upstreams = self._start_children(children, port=port, simulator_port=simulator_port)
        url = f"http://127.0.0.1:{port}"
        banner = self._banner(
            url,
            upstreams,
            admin_password=admin_password,
            token=token,
            decision_log=env["GPUSCHED_DECISION_LOG"],
            run_log=str(output.log_path),
        )
        self._run_until_stopped(children, url=url, banner=banner)

    def _start_children(
        self, children: _Children, *, port: int, simulator_port: int
    ) -> list[Upstream]:
        """The simulators (without LLAMA_SWAP_URL), a dispatcher cluster per
        GPU, the webhook cluster and the web server; the GPUs."""
        python = sys.executable
        env = children.env
        if not os.environ.get("LLAMA_SWAP_URL"):
            env["LLAMA_SWAP_URL"] = self._start_simulators(children.spawn, python, simulator_port)
        try:
            upstreams = parse_upstreams(env["LLAMA_SWAP_URL"])
        except UpstreamListInvalid as exc:
            raise CommandError(str(exc)) from None
        for upstream in upstreams:
            services.gpu_register(name=upstream.name, url=upstream.url)
            # Each GPU's own dispatcher: a cluster of its own (gpusched/settings.py).
            children.spawn(
                f"dispatcher cluster of {upstream.name}",
                [python, "manage.py", "qcluster"],
                env={**env, "GPUSCHED_GPU": upstream.name},
            )
        children.spawn(
            "webhook cluster",
            [python, "manage.py", "qcluster"],
            env={**env, "Q_CLUSTER_NAME": "webhooks"},
        )
        # Daphne's access log (a line per request) only when asked for, as the
        # libraries' INFO lines (gpusched/settings.py).
        daphne = daphne_command(python, port=port, access_log=settings.LOG_LEVEL == "DEBUG")
        # Daphne serves each request in a thread of its own: a pool of
        # connections instead of a new one per request (gpusched/settings.py).
        web_env = {**env, "GPUSCHED_DB_POOL": os.environ.get("GPUSCHED_DB_POOL", "20")}
        children.spawn("web server", daphne, env=web_env)
        return upstreams

    def _banner(
        self,
        url: str,
        upstreams: list[Upstream],
        *,
        admin_password: str,
        token: str,
        decision_log: str,
        run_log: str,
    ) -> str:
        """What the terminal shows once the web server answers."""
        gpus = ", ".join(f"{u.name} {u.url}" for u in upstreams)
        started = {upstream.name for upstream in upstreams}
        # GPUs an earlier run registered (more SIMULATED_GPUS, another
        # LLAMA_SWAP_URL): no dispatcher of this run holds them.
        left_out = [gpu.name for gpu in Gpu.objects.filter(enabled=True) if gpu.name not in started]
        return (
            self.style.SUCCESS(f"\ngpusched is running at {url}/\n")
            + f"  GPUs (llama-swap):     {gpus}\n"
            + (self._left_out_lines(url, left_out) if left_out else "")
            + f"  admin:                 {url}/admin/"
            + f"  (user admin, password {admin_password})\n"
            + f"  demo member token:     {token}\n"
            + f"  dispatch decisions:    {decision_log} (JSON lines)\n"
            + f"  this output, kept in:  {run_log}\n"
            + "  try:  curl -s -X POST "
            + f"{url}/api/jobs/ -H 'Authorization: Bearer {token}' "
            + "-H 'Content-Type: application/json' -H 'X-LlamaSwap-Priority: interactive' "
            + """-d '{"path": "/v1/chat/completions", "body": {"model": "chat-small", """
            + """"messages": [{"role": "user", "content": "hello"}]}}'\n"""
            + "Press Ctrl-C to stop everything.\n"
        )

    def _left_out_lines(self, url: str, names: list[str]) -> str:
        listed = ", ".join(names)
        return self.style.WARNING(
            f"  not started:           {listed}: registered by an earlier run, shown as "
            "'no dispatcher' (and health 'degraded') until it runs again or is disabled:\n"
        ) + "".join(
            f"    curl -s -X PATCH {url}/api/gpus/{name}/ -H 'Authorization: Bearer "
            """$STAFF_TOKEN' -H 'Content-Type: application/json' -d '{"enabled": false}'\n"""
            for name in names
        )

    def _run_until_stopped(self, children: _Children, *, url: str, banner: str) -> None:
        """Show `banner` once the web server answers, then wait for Ctrl-C,
        SIGTERM or a child's exit; stop everything however this ends."""
        stopping = False

        def stop(signum: int, frame: object) -> None:
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)
        try:
            if self._wait_ready(f"{url}/api/health/", children.started, lambda: stopping):
                self.stdout.write(banner)
            elif not stopping and all(child.poll() is None for _, child in children.started):
                self.stderr.write(
                    f"the web server did not answer {url}/api/health/ within "
                    f"{READY_SECONDS} s; stopping"
                )
                stopping = True
            while not stopping:
                for name, child in children.started:
                    if child.poll() is not None:
                        self.stderr.write(f"{name} exited with code {child.returncode}; stopping")
                        stopping = True
                time.sleep(0.2)
        finally:
            self._shut_down(children)

    def _shut_down(self, children: _Children) -> None:
        # A second Ctrl-C (or SIGTERM) during the stop: stop at once.
        at_once = threading.Event()
        signal.signal(signal.SIGINT, lambda signum, frame: at_once.set())
        signal.signal(signal.SIGTERM, lambda signum, frame: at_once.set())
        grace = settings.GPUSCHED_STOP_SECONDS
        self.stdout.write(
            f"stopping: each dispatcher and front-door call finishes its running job first (at "
            f"most {grace:g} s, GPUSCHED_STOP_SECONDS); Ctrl-C again to stop at once"
        )
        first = [child for child in children.started if child not in children.upstreams]
        web = [(name, child) for name, child in first if name == "web server"]
        deadline = time.monotonic() + grace
        # The clusters first; the web server once the front-door calls it
        # relays itself have ended (their jobs are no dispatcher's to finish).
        self._signal_children([child for child in first if child not in web])
        self._wait_front_door_calls(deadline, at_once)
        self._signal_children(web)
        self._wait_children(first, grace=grace, deadline=deadline, at_once=at_once)
        self._stop_children(children.upstreams, grace=STOP_SECONDS, at_once=at_once)
        children.watchdog.release()
        # The embedded PostgreSQL is no child (it outlives run_all by
        # design, see gpusched/embedded_db.py): stopped here, on a clean
        # stop; after a crash the next run attaches to it.
        if not os.environ.get("DATABASE_URL"):
            embedded_db.stop()
        children.output.wait_relayed(timeout=STOP_SECONDS)
        self.stdout.write("stopped")

    def _start_simulators(self, spawn: Callable[..., None], python: str, first_port: int) -> str:
        """SIMULATED_GPUS built-in simulators (default 1) on consecutive
        ports from `first_port`, each serving the demo models, or its GPU's
        llama-swap config (LLAMA_SWAP_CONFIG); their LLAMA_SWAP_URL."""
        try:
            count = int(os.environ.get("SIMULATED_GPUS") or "1")
        except ValueError:
            count = 0
        if not 1 <= count <= MAX_SIMULATED_GPUS:
            raise CommandError(
                f"SIMULATED_GPUS must be a whole number from 1 to {MAX_SIMULATED_GPUS}"
            )
        models = [arg for model in DEMO_MODELS for arg in ("--model", model)]
        urls = []
        for position in range(count):
            port = first_port + position
            # A GPU given a key (LLAMA_SWAP_API_KEY) gets a simulator that
            # wants it, as a llama-swap with `apiKeys` would.
            key = settings.LLAMA_SWAP_API_KEYS.key_for(default_gpu_name(position))
            # A GPU given llama-swap's config (LLAMA_SWAP_CONFIG) gets a
            # simulator serving that config's models with its routing.
            config = settings.LLAMA_SWAP_CONFIGS.path_for(default_gpu_name(position))
            serves = (
                ["--config", config]
                if config
                # The demo models, and a batching server for chat, as
                # llama.cpp's --parallel 4: used once the operator sets
                # chat-small's parallel.
                else ["--accept-any-model", *models, "--model-parallel", "chat-small=4"]
            )
            spawn(
                f"llama-swap simulator {position}",
                [python, "-m", "queueapp.upstream.simulator", *serves]
                + ["--port", str(port), "--swap-seconds", "3", "--default-seconds", "2"]
                + (["--api-key", key] if key else []),
                stdout=subprocess.DEVNULL,
                upstream=True,
            )
            urls.append(f"http://127.0.0.1:{port}")
        return ",".join(urls)  # bare URLs: named gpu0, gpu1, ...

    def _admin_password(self) -> str:
        """Create the admin user on the first run; its password is shown that once."""
        User = get_user_model()
        if User.objects.filter(username="admin").exists():
            return "as shown on the first run; reset: manage.py changepassword admin"
        password = secrets.token_urlsafe(12)
        User.objects.create_superuser("admin", "", password)
        return password

    def _wait_ready(self, health_url: str, children: list, stopped: Callable[[], bool]) -> bool:
        deadline = time.monotonic() + READY_SECONDS
        while time.monotonic() < deadline and not stopped():
            if any(child.poll() is not None for _, child in children):
                return False
            try:
                if httpx.get(health_url, timeout=1).status_code < 500:
                    return True
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        return False

    def _stop_children(
        self,
        children: list[tuple[str, subprocess.Popen]],
        *,
        grace: float,
        at_once: threading.Event,
    ) -> None:
        """Stop `children` together and wait up to `grace` seconds for them;
        kill what still runs then, or as soon as `at_once` is set."""
        self._signal_children(children)
        self._wait_children(
            children, grace=grace, deadline=time.monotonic() + grace, at_once=at_once
        )

    @staticmethod
    def _signal_children(children: list[tuple[str, subprocess.Popen]]) -> None:
        for name, child in children:
            if child.poll() is not None:
                continue
            if "cluster" in name:
                # As Ctrl-C in its own terminal: the main process stops the
                # cluster, the worker finishes its job and claims no other.
                os.killpg(child.pid, signal.SIGINT)
            else:
                child.send_signal(signal.SIGTERM)

    def _wait_front_door_calls(self, deadline: float, at_once: threading.Event) -> None:
        """Until no front-door job runs (the web server relays it to its
        caller), the deadline passes or a second Ctrl-C comes."""
        running = Job.objects.filter(status=JobStatus.RUNNING, front_door=True)
        try:
            while running.exists() and not at_once.is_set() and time.monotonic() < deadline:
                time.sleep(0.1)
        except DatabaseError:
            return  # the database is away: nothing to wait for that it could tell

    def _wait_children(
        self,
        children: list[tuple[str, subprocess.Popen]],
        *,
        grace: float,
        deadline: float,
        at_once: threading.Event,
    ) -> None:
        """Wait for `children` until `deadline`; kill what still runs then,
        or as soon as `at_once` is set."""
        for name, child in children:
            while child.poll() is None and not at_once.is_set() and time.monotonic() < deadline:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.wait(timeout=0.1)  # short: a second Ctrl-C is heard at once
            if child.poll() is None:
                why = "stopping at once" if at_once.is_set() else f"not stopped after {grace:g} s"
                self.stderr.write(f"{name}: {why}; killing it")
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.pid, signal.SIGKILL)
                child.wait()
