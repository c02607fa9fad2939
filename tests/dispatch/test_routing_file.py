"""llama-swap's config file followed by the GPU's dispatcher
(queueapp/dispatch/routing_file.py): a good config recorded as routing any
process rebuilds, each config gpusched cannot use as one line (logged once,
on the row, in health), a changed file read again, and no config changing
nothing."""

from __future__ import annotations

import itertools
import logging
import os
import shutil
import time
from pathlib import Path

import pytest
import yaml

from gpusched.upstreams import ConfigPaths
from queueapp import services
from queueapp.dispatch import routing_file
from queueapp.dispatch.loop import Dispatcher, Ended
from queueapp.dispatch.routing_file import RoutingFile
from queueapp.models import Gpu
from queueapp.policy.routing import evictions, routing_from_config

STUDIO = Path(__file__).resolve().parents[2] / "fixtures" / "llama-swap" / "studio.yaml"
STUDIO_MODELS = ["chat-small", "embed-small", "image-xl", "tts-kokoro", "video-wan"]

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _nothing_logged_yet(monkeypatch):
    monkeypatch.setattr(routing_file, "_logged", {})


@pytest.fixture
def gpu(dispatchers_alive) -> Gpu:
    """GPU gpu0, its dispatcher (the reader of the file) alive."""
    row = services.gpu_register(name="gpu0", url="http://127.0.0.1:9")
    dispatchers_alive(row)
    return row


def fresh(gpu: Gpu) -> Gpu:
    return Gpu.objects.get(pk=gpu.pk)


def listed(api) -> dict:
    (entry,) = api.get("/api/health/").json()["gpus"]
    return entry


def every_eviction(config) -> dict:
    return {
        (frozenset(running), requested): evictions(config, frozenset(running), requested)
        for size in range(3)
        for running in itertools.combinations(config.models, size)
        for requested in [*config.models, *config.aliases]
    }


@pytest.mark.django_db(transaction=True)
def test_the_dispatcher_records_a_good_config_that_rebuilds_the_same_routing(settings, api):
    settings.LLAMA_SWAP_URL = "http://127.0.0.1:9"  # nobody: the pass ends at its claim
    settings.LLAMA_SWAP_CONFIGS = ConfigPaths(for_every_gpu=str(STUDIO))
    dispatcher = Dispatcher(
        services.gpu_configured(None), deadline=time.monotonic() + 20, wait_when_idle=False
    )
    try:
        assert isinstance(dispatcher.tick(), Ended)
    finally:
        dispatcher.close()

    row = Gpu.objects.get(name="gpu0")
    assert row.routing_error == ""
    from_file = routing_from_config(yaml.safe_load(STUDIO.read_text()))
    from_row = routing_from_config(row.routing)
    assert every_eviction(from_row) == every_eviction(from_file)
    entry = listed(api)
    assert (entry["config_models"], entry["routing_error"]) == (STUDIO_MODELS, None)


BAD_CONFIGS = [
    pytest.param(None, "cannot read: No such file or directory", id="missing"),
    pytest.param("models:\n  a: {cmd: x\n", "not valid YAML: line 3, column 1: ", id="yaml"),
    pytest.param("- a\n- b\n", "(top level): must be a mapping, got list", id="not-a-mapping"),
    pytest.param(
        STUDIO.read_text().replace('picture: "c & i"', 'picture: "c & zz"'),
        "routing.router.settings.matrix.sets.picture: unknown var or model 'zz'",
        id="routing",
    ),
]


@pytest.mark.parametrize(("text", "reason"), BAD_CONFIGS)
def test_a_config_that_cannot_be_used_is_one_line_logged_once_and_degrades_health(
    gpu, tmp_path, caplog, api, text, reason
):
    path = tmp_path / "config.yaml"
    if text is not None:
        path.write_text(text)
    expected = f"gpu0: {path}: {reason}"
    with caplog.at_level(logging.INFO, logger=routing_file.__name__):
        RoutingFile(gpu, str(path)).check()
        RoutingFile(fresh(gpu), str(path)).check()  # the next pass of the process

    row = fresh(gpu)
    assert row.routing is None
    assert row.routing_error.startswith(expected) and "\n" not in row.routing_error
    assert [record.getMessage() for record in caplog.records] == [
        f"llama-swap's config cannot be used: {row.routing_error}"
    ]
    health = api.get("/api/health/").json()
    assert health["status"] == "degraded"
    assert health["problems"] == [row.routing_error]
    assert (listed(api)["routing_error"], listed(api)["config_models"]) == (row.routing_error, None)


def test_a_changed_file_is_read_again_and_an_unchanged_one_is_not(gpu, tmp_path, api):
    path = tmp_path / "config.yaml"
    shutil.copyfile(STUDIO, path)
    watched = RoutingFile(gpu, str(path))
    watched.check()
    assert fresh(gpu).routing_error == ""

    # Broken in place, keeping its size and times: not looked at again.
    broken = STUDIO.read_text().replace('picture: "c & i"', 'picture: "c & z"')
    times = os.stat(path)
    path.write_text(broken)
    os.utime(path, ns=(times.st_atime_ns, times.st_mtime_ns))
    watched.check()
    assert fresh(gpu).routing_error == ""

    # llama-swap's config reloaded: a new modification time.
    os.utime(path, ns=(times.st_atime_ns, times.st_mtime_ns + 1_000_000_000))
    watched.check()
    assert "matrix.sets.picture: unknown var or model 'z'" in fresh(gpu).routing_error
    assert api.get("/api/health/").json()["status"] == "degraded"

    shutil.copyfile(STUDIO, path)
    os.utime(path, ns=(times.st_atime_ns, times.st_mtime_ns + 2_000_000_000))
    watched.check()
    row = fresh(gpu)
    assert (row.routing_error, row.config_models) == ("", STUDIO_MODELS)
    assert api.get("/api/health/").json() | {"gpus": None, "upstream": None} == {
        "status": "ok",
        "database": "ok",
        "problems": [],
        "gpus": None,
        "upstream": None,
        "queue": {"queued": 0, "running": 0},
    }


def test_without_a_config_nothing_is_written_and_a_config_removed_is_forgotten(
    gpu, django_assert_num_queries, api
):
    with django_assert_num_queries(0):
        RoutingFile(gpu, None).check()
    entry = listed(api)
    assert (entry["config_models"], entry["routing_error"]) == (None, None)
    assert api.get("/api/health/").json()["status"] == "ok"

    Gpu.objects.filter(pk=gpu.pk).update(routing={"models": {"a": {}}}, routing_error="")
    RoutingFile(fresh(gpu), None).check()
    assert fresh(gpu).routing is None


def test_a_config_reloaded_below_a_models_parallel_is_logged_once_and_degrades_health(
    gpu, tmp_path, caplog, api, monkeypatch
):
    monkeypatch.setattr(routing_file, "_logged_over_limit", {})
    services.gpu_state_record(
        gpu_id=gpu.pk, reachable=True, resident_model=None, served_models=STUDIO_MODELS
    )
    services.model_parallel_set(name="chat-small", parallel=4)  # the studio's limit: 4
    path = tmp_path / "config.yaml"
    path.write_text(STUDIO.read_text().replace("concurrencyLimit: 4", "concurrencyLimit: 2"))
    expected = (
        "gpu0: parallel 4 of chat-small is above its concurrencyLimit 2 in llama-swap's "
        "config; gpusched runs at most 2"
    )
    with caplog.at_level(logging.INFO, logger=routing_file.__name__):
        RoutingFile(gpu, str(path)).check()
        RoutingFile(fresh(gpu), str(path)).check()  # the next pass of the process

    assert [record.getMessage() for record in caplog.records] == [expected]
    health = api.get("/api/health/").json()
    assert (health["status"], health["problems"]) == ("degraded", [expected])
