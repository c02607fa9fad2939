"""deploy/ follows the code, without nginx or systemd: the units run real
commands the way `make run` does, nginx takes the front door's largest body
and streams its paths, the settings file names only settings gpusched reads,
and each command of the deployment guide is one `make smoke-deploy` runs."""

from __future__ import annotations

import ast
import re
import shlex
import tomllib
from importlib.util import find_spec
from pathlib import Path

from django.conf import settings
from django.core.management import get_commands

from gpusched.server_limits import daphne_command
from queueapp.frontdoor import FRONT_DOOR_PATHS, MODELS_PATH
from queueapp.job_body import front_door_body_limit
from tests.environment_reads import environment_variables_read

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
UNITS = DEPLOY / "systemd"
SITE = (DEPLOY / "nginx" / "gpusched.conf").read_text()
GUIDE = ROOT / "docs" / "operations" / "deployment.md"
VENV_BIN = "/opt/gpusched/venv/bin/"
NGINX_SIZE_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}


def unit_values(name: str, key: str) -> list[str]:
    text = (UNITS / name).read_text()
    return [line.partition("=")[2] for line in text.splitlines() if line.startswith(f"{key}=")]


def exec_start(name: str) -> list[str]:
    (line,) = unit_values(name, "ExecStart")
    return shlex.split(line)


def test_the_web_unit_serves_as_make_run_does():
    assert exec_start("gpusched-web@.service") == daphne_command(f"{VENV_BIN}python", port="%i")  # type: ignore[arg-type]
    assert find_spec("gpusched.serve") is not None


def test_the_clusters_units_run_gpusched_admin_commands_that_exist():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["gpusched-admin"] == "gpusched.manage:main"
    commands = get_commands()
    dispatcher = exec_start("gpusched-dispatcher@.service")
    webhooks = exec_start("gpusched-webhooks.service")
    assert dispatcher == [f"{VENV_BIN}gpusched-admin", "dispatcher", "--gpu", "%i"]
    assert webhooks == [f"{VENV_BIN}gpusched-admin", "qcluster"]
    assert {"dispatcher", "qcluster"} <= set(commands)
    assert "Q_CLUSTER_NAME=webhooks" in unit_values("gpusched-webhooks.service", "Environment")
    assert "webhooks" in settings.Q_CLUSTER["ALT_CLUSTERS"]


def test_each_unit_stops_as_its_process_expects_within_the_grace():
    grace = float(env_template()["GPUSCHED_STOP_SECONDS"])
    stops = {
        "gpusched-web@.service": ("SIGTERM", "mixed"),
        "gpusched-dispatcher@.service": ("SIGINT", "control-group"),
        "gpusched-webhooks.service": ("SIGINT", "control-group"),
    }
    for unit, (signal, mode) in stops.items():
        assert unit_values(unit, "KillSignal") == [signal], unit
        assert unit_values(unit, "KillMode") == [mode], unit
        (timeout,) = unit_values(unit, "TimeoutStopSec")
        assert grace < float(timeout) <= grace + 30, unit
        assert unit_values(unit, "EnvironmentFile") == ["/etc/gpusched/gpusched.env"]
        assert unit_values(unit, "WantedBy") == ["gpusched.target"]


def test_the_clusters_stop_before_every_web_server_nginx_knows():
    upstreams = re.findall(r"server 127\.0\.0\.1:(\d+);", SITE)
    assert len(upstreams) >= 2  # one restarts while the other answers
    web = {f"gpusched-web@{port}.service" for port in upstreams}
    for unit in ("gpusched-dispatcher@.service", "gpusched-webhooks.service"):
        after = {name for line in unit_values(unit, "After") for name in line.split()}
        assert web <= after, unit


def nginx_bytes(size: str) -> int:
    number, unit = re.fullmatch(r"(\d+)([kmg]?)", size.lower()).groups()  # type: ignore[union-attr]
    return int(number) * NGINX_SIZE_UNITS[unit]


def test_nginx_takes_the_front_doors_largest_body():
    (size,) = re.findall(r"client_max_body_size (\w+);", SITE)
    largest = max(front_door_body_limit(path).bytes for path in FRONT_DOOR_PATHS)
    assert nginx_bytes(size) == largest


def test_nginx_streams_every_front_door_path():
    unbuffered = [
        prefix
        for prefix, block in re.findall(r"location (\S+) \{(.*?)\}", SITE, re.DOTALL)
        if "proxy_buffering off;" in block and "proxy_read_timeout" in block
    ]
    for path in (*FRONT_DOOR_PATHS, MODELS_PATH):
        assert any(path.startswith(prefix) for prefix in unbuffered), path
    assert "proxy_next_upstream error;" in SITE
    assert "X-Forwarded-Proto $scheme" in SITE


def env_template() -> dict[str, str]:
    values = {}
    for line in (DEPLOY / "gpusched.env").read_text().splitlines():
        line = line.lstrip("#")
        if re.match(r"[A-Z][A-Z0-9_]*=", line):
            key, _, value = line.partition("=")
            values[key] = value
    return values


def test_the_settings_file_names_only_settings_gpusched_reads():
    named = set(env_template())
    assert {"GPUSCHED_PRODUCTION", "DJANGO_SECRET_KEY", "ALLOWED_HOSTS", "DATABASE_URL"} <= named
    assert sorted(named - environment_variables_read()) == []


def guide_commands(section: str = "") -> list[str]:
    """The command lines of the guide's shell blocks (comments aside), in the
    section headed `section` or in all of them."""
    text = GUIDE.read_text()
    if section:
        text = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", text, re.DOTALL)
    lines = [line.strip() for block in blocks for line in block.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


def smoke_commands() -> set[str]:
    tree = ast.parse((DEPLOY / "smoke_deploy.py").read_text())
    return {
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id.startswith("GUIDE_") for t in node.targets)
    }


def test_every_command_of_the_guide_is_one_smoke_deploy_runs():
    # The wheel's build, then ten commands from a bare machine to a service.
    assert len(guide_commands("One machine")) <= 11
    assert sorted(set(guide_commands()) - smoke_commands()) == []
