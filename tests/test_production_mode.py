"""Production mode (GPUSCHED_PRODUCTION=1): `manage.py check --deploy`
passes with its secret key and host names given, and each missing one is
a clear error; without it, gpusched starts with no settings (the demo).
Each case runs `manage.py` in a process of its own: settings are read once
per process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
KEY = "k" * 20 + "0123456789abcdefghijklmnopqrstuvwxyz"  # 56 characters, varied


def check_deploy(**env: str) -> subprocess.CompletedProcess[str]:
    environment = {
        name: value
        for name, value in os.environ.items()
        if name not in ("DJANGO_SECRET_KEY", "ALLOWED_HOSTS", "DJANGO_DEBUG")
    }
    # No database is opened by the checks: any URL will do.
    environment.update(DATABASE_URL="postgresql://localhost/unused", **env)
    return subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.e2e  # starts a process
def test_production_mode_passes_the_deploy_check():
    done = check_deploy(
        GPUSCHED_PRODUCTION="1", DJANGO_SECRET_KEY=KEY, ALLOWED_HOSTS="gpusched.example.com"
    )
    assert done.returncode == 0, done.stderr
    assert "no issues" in done.stdout


@pytest.mark.e2e  # starts a process
def test_the_demo_mode_is_what_the_deploy_check_warns_about():
    done = check_deploy(DJANGO_SECRET_KEY=KEY)
    assert done.returncode != 0
    assert "SECURE_SSL_REDIRECT" in done.stderr


@pytest.mark.e2e  # starts a process
@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"ALLOWED_HOSTS": "gpusched.example.com"}, "DJANGO_SECRET_KEY"),
        ({"DJANGO_SECRET_KEY": "short", "ALLOWED_HOSTS": "x.example"}, "DJANGO_SECRET_KEY"),
        ({"DJANGO_SECRET_KEY": KEY}, "ALLOWED_HOSTS"),
        ({"DJANGO_SECRET_KEY": KEY, "ALLOWED_HOSTS": "x.example", "DJANGO_DEBUG": "1"}, "DEBUG"),
    ],
)
def test_production_mode_names_what_is_missing(env, named):
    done = check_deploy(GPUSCHED_PRODUCTION="1", **env)
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert "ImproperlyConfigured" in last and named in last
