"""What `make run` prints when the database knows GPUs it does not start
(an earlier run had more SIMULATED_GPUS, or another LLAMA_SWAP_URL): their
names, and the command that takes each out of service."""

from __future__ import annotations

import pytest

from gpusched.upstreams import Upstream
from queueapp import services
from queueapp.management.commands.run_all import Command

pytestmark = pytest.mark.django_db


def banner(started: list[str]) -> str:
    upstreams = [Upstream(name=name, url=f"http://127.0.0.1:9/{name}") for name in started]
    return Command()._banner(
        "http://127.0.0.1:8000",
        upstreams,
        admin_password="secret",
        token="token",
        decision_log="decisions.jsonl",
        run_log="run.log",
    )


def test_the_gpus_registered_but_not_started_are_named_with_the_command_that_disables_them():
    for name in ("gpu0", "gpu1", "gpu2"):
        services.gpu_register(name=name, url=f"http://127.0.0.1:9/{name}")
    services.gpu_settings_update(name="gpu2", changes={"enabled": False})  # out of service

    text = banner(["gpu0"])
    assert "not started:           gpu1: registered by an earlier run" in text
    assert "curl -s -X PATCH http://127.0.0.1:8000/api/gpus/gpu1/" in text
    assert """-d '{"enabled": false}'""" in text
    assert "gpu2" not in text  # disabled: nothing to say

    assert "not started" not in banner(["gpu0", "gpu1"])
