"""The delivery rules that need neither a database nor a receiver."""

import os
import subprocess
import sys
from datetime import UTC, datetime

import pytest

from queueapp.http_headers import retry_after_seconds
from queueapp.webhooks.delivery import _next_pause


def test_the_pause_before_a_retry_follows_the_schedule_with_jitter(settings):
    settings.WEBHOOK_RETRY_SCHEDULE = [5.0, 300.0, 1800.0]
    for attempts_made, step in enumerate(settings.WEBHOOK_RETRY_SCHEDULE, start=1):
        pauses = [_next_pause(attempts_made, None) for _ in range(200)]
        assert all(0.9 * step <= pause <= 1.1 * step for pause in pauses)
        assert max(pauses) - min(pauses) > 0.1 * step  # spread, not one fixed value
    assert _next_pause(4, None) is None  # the schedule is spent
    assert _next_pause(4, 10.0) is None
    assert _next_pause(1, 200.0) == 200.0  # a longer Retry-After wins
    assert _next_pause(1, 1e12) == 1800.0  # up to the longest pause


def test_retry_after_values():
    now = datetime(2015, 10, 21, 7, 26, tzinfo=UTC)
    assert retry_after_seconds("120", now=now) == 120.0
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT", now=now) == 120.0
    assert retry_after_seconds("Wed, 21 Oct 2015 07:00:00 GMT", now=now) == 0.0
    for junk in (None, "", "soon", "-5", "inf", "nan", "1e999"):
        assert retry_after_seconds(junk, now=now) is None


@pytest.mark.e2e  # starts a process
def test_the_public_url_defaults_to_where_make_run_serves():
    bare = {k: v for k, v in os.environ.items() if k not in ("GPUSCHED_PUBLIC_URL", "PORT")}
    code = "from django.conf import settings; print(settings.GPUSCHED_PUBLIC_URL)"
    for extra, expected in (
        ({}, "http://127.0.0.1:8000"),
        ({"PORT": "8123"}, "http://127.0.0.1:8123"),
        (
            {"PORT": "8123", "GPUSCHED_PUBLIC_URL": "https://gpu.example.org/"},
            "https://gpu.example.org",
        ),
    ):
        out = subprocess.run(
            [sys.executable, "-c", code],
            env={**bare, **extra, "DJANGO_SETTINGS_MODULE": "gpusched.settings"},
            capture_output=True,
            text=True,
            check=True,
        )
        assert out.stdout.strip() == expected, extra
