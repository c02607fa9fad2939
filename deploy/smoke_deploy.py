"""`make smoke-deploy`: the deployment guide, run end to end on this machine.

It builds the wheel, then runs the commands of docs/operations/deployment.md
(as written there: the GUIDE_* constants below) against the PostgreSQL
server on 127.0.0.1:5432 and Redis on 127.0.0.1:6379, moved under a
temporary folder: /opt/gpusched, /etc/gpusched, /var/lib/gpusched, the
units' and nginx's folders, and a database of its own. The current user
stands in for the users gpusched and postgres, and, where no systemd runs,
the script does what `systemctl` would: it starts each unit's ExecStart line
(read from deploy/systemd/, so it cannot drift), stops them in the units'
order with their KillSignal and checks each exits 0 within TimeoutStopSec.
nginx runs deploy/nginx/gpusched.conf with its ports and certificate moved.
Through nginx over HTTPS: a REST job, a front-door chat, a streaming one,
the dashboard's WebSocket. One line per step; on a failure, the step and
the processes' last log lines, and a non-zero exit. Everything it started
or created is removed however it ends.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from deploy.smoke_layout import (  # noqa: E402
    Layout,
    Service,
    env_file_values,
    nginx_config,
    stop_order,
    unit_service,
)
from deploy.smoke_requests import through_nginx  # noqa: E402
from gpusched.stack import free_port, wait_for  # noqa: E402

# The guide's commands, as docs/operations/deployment.md gives them
# (tests/test_deploy_files.py checks that each of the guide's is here).
GUIDE_BUILD = "python3 -m build --wheel --outdir dist"
GUIDE_CREATE_USER = (
    "useradd --system --create-home --home-dir /var/lib/gpusched --shell /usr/sbin/nologin gpusched"
)
GUIDE_CREATE_DATABASE = (
    "runuser -u postgres -- createuser gpusched && "
    "runuser -u postgres -- createdb --owner gpusched gpusched"
)
GUIDE_INSTALL = (
    "python3 -m venv /opt/gpusched/venv && /opt/gpusched/venv/bin/pip install dist/gpusched-*.whl"
)
GUIDE_ENV_FILE = "install -D -m 0640 -g gpusched deploy/gpusched.env /etc/gpusched/gpusched.env"
GUIDE_ADMIN = (
    "gpusched_admin() { runuser -u gpusched -- sh -c 'set -a && . /etc/gpusched/gpusched.env "
    '&& exec /opt/gpusched/venv/bin/gpusched-admin "$@"\' gpusched-admin "$@"; }'
)
GUIDE_MIGRATE = (
    "gpusched_admin check --deploy --fail-level WARNING && gpusched_admin migrate "
    "&& gpusched_admin loaddata tiers policy"
)
GUIDE_MEMBERS = (
    "DJANGO_SUPERUSER_PASSWORD=choose-one gpusched_admin createsuperuser --noinput "
    "--username admin --email admin@example.com && gpusched_admin createmember alice --tier pro"
)
GUIDE_COPY = (
    "install -m 0644 deploy/systemd/* /etc/systemd/system/ && "
    "install -D -m 0644 deploy/nginx/gpusched.conf /etc/nginx/sites-enabled/gpusched.conf"
)
GUIDE_START = (
    "systemctl daemon-reload && systemctl enable --now gpusched.target "
    "gpusched-web@8001 gpusched-web@8002 gpusched-dispatcher@gpu0 gpusched-webhooks"
)
GUIDE_NGINX = "nginx -t && systemctl reload nginx"
# A GPU machine's dispatchers alone (the guide's several machines).
GUIDE_START_GPU_MACHINE = (
    "systemctl daemon-reload && systemctl enable --now gpusched-dispatcher@gpu0"
)
# Stood in for, as the module's docstring says: no user is created, and
# systemctl's part is done by starting the units' commands.
STOOD_IN_FOR = (GUIDE_CREATE_USER, GUIDE_START, GUIDE_START_GPU_MACHINE)

WHEEL_CARRIES = (
    "queueapp/templates/dashboard.html",
    "queueapp/sql/job_notify.sql",
    "queueapp/migrations/0001_initial.py",
    "queueapp/fixtures/tiers.json",
    "gpusched/serve.py",
)
SERVICE_READY_SECONDS = 60


class StepFailed(Exception):
    pass


@contextmanager
def step(name: str):
    started = time.monotonic()
    try:
        yield
    except Exception as exc:
        raise StepFailed(f"{name}: {type(exc).__name__}: {exc}") from exc
    print(f"ok      {name} ({time.monotonic() - started:.1f} s)", flush=True)


def shell(command: str, layout: Layout, *, preamble: str = "", cwd: Path | None = None) -> str:
    """A guide command, moved to the temporary layout, run by bash; its output."""
    script = layout.relocated(f"{preamble}\n{command}" if preamble else command)
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        env=layout.clean_env(),
        cwd=cwd or layout.root,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        raise RuntimeError(f"`{script}` exited {done.returncode}:\n{done.stdout}{done.stderr}")
    return done.stdout


def wheel_built(layout: Layout) -> None:
    """The guide's build, in a copy of the checkout's files (the build writes
    build/ and *.egg-info/ where it runs, and would reuse stale ones)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    source = layout.root / "src"
    for name in filter(None, listed.split("\0")):
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    shell(GUIDE_BUILD, layout, cwd=source)
    (wheel,) = layout.wheel_dir.glob("gpusched-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [name for name in WHEEL_CARRIES if name not in names]
    if missing:
        raise RuntimeError(f"the wheel lacks {', '.join(missing)}")


def env_file_filled(layout: Layout) -> None:
    """The guide's "then edit it": the values this machine needs."""
    path = layout.env_file
    values = {
        "DJANGO_SECRET_KEY": layout.secret_key,
        "ALLOWED_HOSTS": "localhost",
        "GPUSCHED_PUBLIC_URL": f"https://localhost:{layout.https_port}",
        "DATABASE_URL": f"postgresql://{layout.database}@127.0.0.1:5432/{layout.database}",
        "REDIS_URL": layout.redis_url,
        "LLAMA_SWAP_URL": f"gpu0=http://127.0.0.1:{layout.simulator_port}",
    }
    lines = layout.relocated(path.read_text()).splitlines()  # GPUSCHED_VAR_DIR
    for key, value in values.items():
        found = [n for n, line in enumerate(lines) if line.startswith(f"{key}=")]
        if len(found) != 1:
            raise RuntimeError(f"{path.name} should set {key} once")
        lines[found[0]] = f"{key}={value}"
    path.write_text("\n".join(lines) + "\n")
    if env_file_values(path)["GPUSCHED_VAR_DIR"] != str(layout.var_dir):
        raise RuntimeError("GPUSCHED_VAR_DIR did not move to the temporary layout")


def units_verified(layout: Layout) -> None:
    """systemd-analyze verify, offline (no systemd needs to run), on the
    units as installed: one instance of each template."""
    names = [
        "gpusched.target",
        "gpusched-web@8001.service",
        "gpusched-dispatcher@gpu0.service",
        "gpusched-webhooks.service",
    ]
    done = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", *(str(layout.unit_dir / n) for n in names)],
        env={**layout.clean_env(), "SYSTEMD_UNIT_PATH": f"{layout.unit_dir}:"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    # A setting it cannot parse is only a warning: any word from it fails.
    if done.returncode != 0 or done.stderr.strip() or done.stdout.strip():
        raise RuntimeError(f"systemd-analyze verify:\n{done.stdout}{done.stderr}")


def started(layout: Layout, service: Service) -> Service:
    log = open(layout.log_dir / f"{service.name}.log", "wb")  # noqa: SIM115  # kept by the child
    service.process = subprocess.Popen(
        service.argv,
        env=service.env,
        cwd=service.cwd,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group, as a unit's cgroup
    )
    layout.running.append(service)
    return service


def services_started(layout: Layout) -> list[Service]:
    """What `systemctl enable --now` would start, from the units' own lines."""
    env = env_file_values(layout.env_file)
    units = layout.unit_dir
    chosen = [
        unit_service(units / "gpusched-web@.service", str(port), layout, env)
        for port in layout.web_ports
    ]
    chosen.append(unit_service(units / "gpusched-dispatcher@.service", "gpu0", layout, env))
    chosen.append(unit_service(units / "gpusched-webhooks.service", "", layout, env))
    for service in chosen:
        started(layout, service)
    for port in layout.web_ports:
        wait_for(
            lambda port=port: layout.answers(f"http://127.0.0.1:{port}/api/health/"),
            timeout=SERVICE_READY_SECONDS,
            message=f"the web server on {port} to answer its health check",
        )
    return chosen


def nginx_started(layout: Layout) -> None:
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
        + ["-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost"]
        + ["-keyout", str(layout.cert_key), "-out", str(layout.cert)],
        check=True,
        capture_output=True,
        timeout=60,
    )
    site = layout.root / "nginx" / "gpusched.conf"
    site.write_text(nginx_config(site.read_text(), layout))
    main_config = layout.root / "nginx" / "nginx.conf"
    main_config.write_text(layout.nginx_main_config(site))
    test = subprocess.run(
        ["nginx", "-t", "-c", str(main_config), "-p", str(layout.root / "nginx")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if test.returncode != 0:
        raise RuntimeError(f"nginx -t:\n{test.stderr}")
    nginx = Service(
        name="nginx",
        argv=["nginx", "-c", str(main_config), "-p", str(layout.root / "nginx")],
        env=layout.clean_env(),
        cwd=layout.root,
        stop_signal=signal.SIGQUIT,  # nginx's graceful stop
        stop_seconds=30,
    )
    started(layout, nginx)
    wait_for(
        lambda: layout.answers(f"https://localhost:{layout.https_port}/api/health/"),
        timeout=30,
        message="nginx to answer over HTTPS",
    )


def stopped_in_order(layout: Layout, services: list[Service]) -> list[str]:
    """Each service stopped once, in the units' order, then nginx; the lines."""
    nginx = [s for s in layout.running if s.name == "nginx"]
    web = [s for s in services if s.name.startswith("gpusched-web@")]
    lines = []
    for service in [*stop_order(services), *nginx]:
        took = service.stop()
        lines.append(f"{service.name} exited 0 in {took:.1f} s")
        if service in web and service is not web[-1]:
            # nginx passes each refused connection to the web server still up.
            for _ in range(len(web) * 2):
                if not layout.answers(f"https://localhost:{layout.https_port}/api/health/"):
                    raise RuntimeError(f"nginx did not answer with {service.name} stopped")
            lines.append("  every request through nginx answered by the other web server")
    return lines


def smoke(layout: Layout) -> None:
    with step("build the wheel (guide); it carries the templates, SQL, migrations, fixtures"):
        wheel_built(layout)
    with step("create the database (guide)"):
        shell(GUIDE_CREATE_DATABASE, layout)
    with step("install the wheel into a new venv (guide)"):
        shell(GUIDE_INSTALL, layout)
    with step("install the settings file and fill it in (guide)"):
        shell(GUIDE_ENV_FILE, layout)
        env_file_filled(layout)
    with step("check --deploy, migrate, load tiers and policy (guide)"):
        shell(GUIDE_MIGRATE, layout, preamble=GUIDE_ADMIN)
    with step("create the admin and a member (guide)"):
        layout.token = shell(GUIDE_MEMBERS, layout, preamble=GUIDE_ADMIN).split()[-1]
    with step("install the units and the nginx site (guide)"):
        layout.unit_dir.mkdir()
        (layout.root / "nginx").mkdir()
        shell(GUIDE_COPY, layout)
    with step("systemd-analyze verify the units, rewritten to the installed layout"):
        for unit in layout.unit_dir.iterdir():
            unit.write_text(layout.relocated(unit.read_text()))
        units_verified(layout)
    with step("start the llama-swap simulator from the installed package"):
        started(layout, layout.simulator())
        wait_for(
            lambda: layout.answers(f"http://127.0.0.1:{layout.simulator_port}/v1/models"),
            timeout=30,
            message="the simulator",
        )
    with step("start every unit's ExecStart (web@ x2, dispatcher@gpu0, webhooks)"):
        services = services_started(layout)
    with step("nginx -t and start nginx with the site (guide)"):
        nginx_started(layout)
    for name, check in through_nginx(layout):
        with step(f"through nginx: {name}"):
            check()
    with step("stop in the units' order, each exits 0 within TimeoutStopSec"):
        for line in stopped_in_order(layout, services):
            print(f"        {line}", flush=True)


def cleaned_up(layout: Layout) -> None:
    for service in reversed(layout.running):
        service.kill()
    subprocess.run(
        ["psql", "-h", "127.0.0.1", "-U", "postgres", "-d", "postgres", "-q"]
        + ["-c", f"DROP DATABASE IF EXISTS {layout.database} WITH (FORCE)"]
        + ["-c", f"DROP ROLE IF EXISTS {layout.database}"],
        capture_output=True,
        timeout=60,
    )
    shutil.rmtree(layout.root, ignore_errors=True)


def main() -> int:
    started_at = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="gpusched-smoke-"))
    layout = Layout.under(root, database=f"gpusched_smoke_{os.getpid()}", free_port=free_port)
    layout.log_dir.mkdir()
    try:
        smoke(layout)
    except StepFailed as failure:
        print(f"FAILED  {failure}", flush=True)
        layout.print_log_tails()
        return 1
    finally:
        cleaned_up(layout)
    print(f"smoke-deploy passed in {time.monotonic() - started_at:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
