"""The temporary layout `make smoke-deploy` installs into, and what it reads
from deploy/: the units' commands and order, the settings file, the nginx
site with its ports and certificate moved (deploy/smoke_deploy.py)."""

from __future__ import annotations

import os
import secrets
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

PREFIX = "/opt/gpusched"
ENV_FILE = "/etc/gpusched/gpusched.env"
VAR_DIR = "/var/lib/gpusched"
# The nginx site's ports, upstreams and certificate, as deploy/ gives them.
SITE_HTTP_LISTEN = "listen 80;"
SITE_HTTPS_LISTEN = "listen 443 ssl;"
SITE_IPV6_LISTENS = ("listen [::]:80;\n", "listen [::]:443 ssl;\n")
SITE_CERT = "/etc/ssl/certs/gpusched.example.com.pem"
SITE_CERT_KEY = "/etc/ssl/private/gpusched.example.com.key"
SITE_WEB_PORTS = (8001, 8002)
# The environment a unit starts with before its own settings (systemd's PATH).
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def env_file_values(path: Path) -> dict[str, str]:
    """KEY=value lines, as systemd's EnvironmentFile= reads them (no quoting used)."""
    values = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    return values


def unit_lines(unit: Path, key: str) -> list[str]:
    """The values of `key=` in a unit file, in order."""
    return [
        line.partition("=")[2].strip()
        for line in unit.read_text().splitlines()
        if line.startswith(f"{key}=")
    ]


@dataclass
class Service:
    """A started process, and how its unit stops it."""

    name: str
    argv: list[str]
    env: dict[str, str]
    cwd: Path
    stop_signal: signal.Signals
    stop_seconds: float
    after: tuple[str, ...] = ()
    process: subprocess.Popen | None = None

    def stop(self) -> float:
        """Its unit's stop: the signal (to the whole group for a cluster),
        once; it must exit 0 within TimeoutStopSec. The seconds it took."""
        assert self.process is not None
        started = time.monotonic()
        if self.stop_signal == signal.SIGINT:
            os.killpg(self.process.pid, self.stop_signal)  # KillMode=control-group
        else:
            self.process.send_signal(self.stop_signal)  # KillMode=mixed: the main process
        try:
            code = self.process.wait(timeout=self.stop_seconds)
        except subprocess.TimeoutExpired:
            raise RuntimeError(
                f"{self.name} still ran {self.stop_seconds:g} s after its stop"
            ) from None
        if code != 0:
            raise RuntimeError(f"{self.name} exited {code} after its stop")
        return time.monotonic() - started

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.process.wait(timeout=30)


def unit_service(unit: Path, instance: str, layout: Layout, env_file: dict[str, str]) -> Service:
    """The process a unit runs: its ExecStart with %i, its Environment= under
    the settings file's (systemd's precedence), its stop signal and timeout."""
    (exec_start,) = unit_lines(unit, "ExecStart")
    env = {"PATH": SYSTEM_PATH, "LANG": "C.UTF-8", "HOME": str(layout.var_dir)}
    for assignment in unit_lines(unit, "Environment"):
        key, _, value = assignment.partition("=")
        env[key] = value
    env.update(env_file)
    (working_directory,) = unit_lines(unit, "WorkingDirectory")
    (kill_signal,) = unit_lines(unit, "KillSignal")
    (timeout,) = unit_lines(unit, "TimeoutStopSec")
    after = tuple(name for line in unit_lines(unit, "After") for name in line.split())
    name = unit.name.replace("@.", f"@{instance}.") if instance else unit.name
    return Service(
        name=name,
        argv=shlex.split(exec_start.replace("%i", instance)),
        env=env,
        cwd=Path(working_directory),
        stop_signal=signal.Signals[kill_signal],
        stop_seconds=float(timeout),
        after=after,
    )


def stop_order(services: list[Service]) -> list[Service]:
    """The reverse of their start order: a service whose After= names
    another is stopped before it, as systemd does."""
    names = {service.name for service in services}
    for service in services:
        unknown = [n for n in service.after if n.startswith("gpusched-") and n not in names]
        if unknown:
            raise RuntimeError(f"{service.name} is ordered after {unknown}, which do not run")
    left = list(services)
    ordered = []
    while left:
        named = {name for service in left for name in service.after}
        free = [service for service in left if service.name not in named]
        if not free:
            raise RuntimeError("the units' After= lines form a cycle")
        ordered.extend(free)
        left = [service for service in left if service not in free]
    return ordered


def _replaced(text: str, old: str, new: str) -> str:
    if old not in text:
        raise RuntimeError(f"deploy/nginx/gpusched.conf no longer has {old!r}")
    return text.replace(old, new)


def nginx_config(site: str, layout: Layout) -> str:
    """The site with its ports and certificate moved to the temporary layout."""
    site = _replaced(site, SITE_HTTP_LISTEN, f"listen 127.0.0.1:{layout.http_port};")
    site = _replaced(site, SITE_HTTPS_LISTEN, f"listen 127.0.0.1:{layout.https_port} ssl;")
    for ipv6 in SITE_IPV6_LISTENS:
        site = _replaced(site, ipv6, "")
    site = _replaced(site, SITE_CERT, str(layout.cert))
    site = _replaced(site, SITE_CERT_KEY, str(layout.cert_key))
    for site_port, port in zip(SITE_WEB_PORTS, layout.web_ports, strict=True):
        site = _replaced(site, f"server 127.0.0.1:{site_port};", f"server 127.0.0.1:{port};")
    return site


@dataclass
class Layout:
    """Where everything goes under one temporary folder, and what runs."""

    root: Path
    database: str
    web_ports: tuple[int, int]
    simulator_port: int
    http_port: int
    https_port: int
    secret_key: str = field(default_factory=lambda: secrets.token_urlsafe(50))
    redis_url: str = "redis://127.0.0.1:6379/13"
    token: str = ""
    running: list[Service] = field(default_factory=list)

    @classmethod
    def under(cls, root: Path, *, database: str, free_port: Callable[[], int]) -> Layout:
        return cls(
            root=root,
            database=database,
            web_ports=(free_port(), free_port()),
            simulator_port=free_port(),
            http_port=free_port(),
            https_port=free_port(),
        )

    @property
    def wheel_dir(self) -> Path:
        return self.root / "dist"

    @property
    def prefix(self) -> Path:  # /opt/gpusched
        return self.root / "opt"

    @property
    def var_dir(self) -> Path:  # /var/lib/gpusched
        return self.root / "var"

    @property
    def env_file(self) -> Path:  # /etc/gpusched/gpusched.env
        return self.root / "etc" / "gpusched.env"

    @property
    def unit_dir(self) -> Path:  # /etc/systemd/system
        return self.root / "systemd"

    @property
    def log_dir(self) -> Path:
        return self.root / "logs"

    @property
    def cert(self) -> Path:
        return self.root / "localhost.pem"

    @property
    def cert_key(self) -> Path:
        return self.root / "localhost.key"

    def relocated(self, text: str) -> str:
        """A guide command or a unit, with the installed paths moved here and
        the current user standing in for gpusched and postgres."""
        checkout = Path(__file__).resolve().parent.parent
        replacements = [
            # The build tool of the interpreter running this, not the system's.
            ("python3 -m build", f"{sys.executable} -m build"),
            ("--outdir dist", f"--outdir {self.wheel_dir}"),
            ("runuser -u postgres -- ", ""),
            ("runuser -u gpusched -- ", ""),
            ("createuser gpusched", f"createuser {self.database}"),
            ("--owner gpusched gpusched", f"--owner {self.database} {self.database}"),
            (" -g gpusched ", " "),
            (" dist/", f" {self.wheel_dir}/"),
            (" deploy/", f" {checkout}/deploy/"),
            ("/etc/systemd/system/", f"{self.unit_dir}/"),
            ("/etc/nginx/sites-enabled/", f"{self.root}/nginx/"),
            (ENV_FILE, str(self.env_file)),
            (PREFIX, str(self.prefix)),
            (VAR_DIR, str(self.var_dir)),
        ]
        # The web servers' instances are free ports here (After= names them).
        for site_port, port in zip(SITE_WEB_PORTS, self.web_ports, strict=True):
            replacements.append((f"gpusched-web@{site_port}.", f"gpusched-web@{port}."))
        for old, new in replacements:
            text = text.replace(old, new)
        return text

    def clean_env(self) -> dict[str, str]:
        """No variable of this shell (PYTHONPATH above all: the wheel is under
        test, not the checkout), but pip's own and PostgreSQL's server."""
        env = {"PATH": SYSTEM_PATH, "LANG": "C.UTF-8", "HOME": str(self.root)}
        env.update({k: v for k, v in os.environ.items() if k.startswith("PIP_")})
        env.update(PGHOST="127.0.0.1", PGPORT="5432", PGUSER="postgres")
        return env

    def simulator(self) -> Service:
        python = str(self.prefix / "venv" / "bin" / "python")
        argv = [python, "-m", "queueapp.upstream.simulator", "--port", str(self.simulator_port)]
        return Service(
            name="llama-swap simulator",
            argv=[*argv, "--model", "chat-small=1", "--accept-any-model"],
            env=self.clean_env(),
            cwd=self.root,
            stop_signal=signal.SIGTERM,
            stop_seconds=15,
        )

    def nginx_main_config(self, site: Path) -> str:
        """An nginx.conf of its own, in the foreground, that includes the site."""
        nginx = self.root / "nginx"
        user = "user root;\n" if os.geteuid() == 0 else ""  # its workers may read the layout
        temp = "\n".join(
            f"    {kind}_temp_path {nginx / kind};"
            for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
        )
        return (
            f"{user}daemon off;\npid {nginx / 'nginx.pid'};\n"
            f"error_log {self.log_dir / 'nginx-error.log'} warn;\n"
            f"events {{}}\nhttp {{\n    access_log {self.log_dir / 'nginx-access.log'};\n"
            f"{temp}\n    include {site};\n}}\n"
        )

    def answers(self, url: str) -> bool:
        """Whether `url` answers 200, as the site's host (ALLOWED_HOSTS)."""
        try:
            with httpx.Client(verify=str(self.cert) if url.startswith("https") else True) as c:
                return c.get(url, headers={"Host": "localhost"}, timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    def print_log_tails(self, lines: int = 15) -> None:
        for log in sorted(self.log_dir.glob("*.log")):
            tail = log.read_text(errors="replace").splitlines()[-lines:]
            print(f"--- {log.name} (last {len(tail)} lines)", file=sys.stderr)
            for line in tail:
                print(f"    {line}", file=sys.stderr)
