"""`LLAMA_SWAP_CONFIG` read (gpusched/upstreams.py): one file for every GPU
or one per GPU, a clear start-up error for a value that cannot be read, and
`manage.py dispatcher --config` giving its cluster the GPU's file alone."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from gpusched.upstreams import ConfigPaths, ConfigPathsInvalid, parse_config_paths

GPUS = ["gpu0", "gpu1"]


def manage(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("LLAMA_SWAP_")}
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=Path(__file__).resolve().parent.parent,
        env={**environ, "DJANGO_SETTINGS_MODULE": "gpusched.settings", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


STUDIO = str(Path(__file__).resolve().parent.parent / "fixtures" / "llama-swap" / "studio.yaml")


def paths(text: str) -> ConfigPaths:
    return parse_config_paths(text, gpu_names=GPUS)


def test_one_path_is_every_gpus_config():
    parsed = paths(" /etc/llama-swap/config.yaml ")
    assert [parsed.path_for(gpu) for gpu in GPUS] == ["/etc/llama-swap/config.yaml"] * 2


def test_paths_by_name_go_to_their_gpu_and_a_gpu_without_one_has_none():
    parsed = paths("gpu1 = /srv/b.yaml")
    assert (parsed.path_for("gpu0"), parsed.path_for("gpu1")) == (None, "/srv/b.yaml")
    both = paths("gpu0=/srv/a.yaml,gpu1=/srv/x=y.yaml")
    assert (both.path_for("gpu0"), both.path_for("gpu1")) == ("/srv/a.yaml", "/srv/x=y.yaml")


def test_unset_or_empty_is_no_config():
    assert paths("  ") == ConfigPaths()
    assert paths("").path_for("gpu0") is None


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("/a.yaml,/b.yaml", "several files are given per GPU (NAME=PATH,NAME=PATH)"),
        ("gpu0=/a.yaml,,gpu1=/b.yaml", "entry 2 ('') is not NAME=PATH"),
        ("gpu0=/a.yaml,/b.yaml", "entry 2 ('/b.yaml') is not NAME=PATH"),
        ("gpu0=", "entry 1 ('gpu0=') is not NAME=PATH"),
        ("gpu9=/a.yaml", "'gpu9' is not a GPU of LLAMA_SWAP_URL (it names gpu0, gpu1)"),
        ("gpu0=/a.yaml,gpu0=/b.yaml", "the GPU 'gpu0' is given twice"),
    ],
)
def test_a_malformed_value_is_refused_with_a_reason(text, says):
    with pytest.raises(ConfigPathsInvalid) as refused:
        paths(text)
    assert str(refused.value).startswith("LLAMA_SWAP_CONFIG: ")
    assert says in str(refused.value)


@pytest.mark.e2e  # starts a process
def test_a_bad_setting_stops_the_start_with_its_reason():
    urls = "gpu0=http://127.0.0.1:9001,gpu1=http://127.0.0.1:9002"
    refused = manage("check", LLAMA_SWAP_URL=urls, LLAMA_SWAP_CONFIG="gpu2=/srv/a.yaml")
    assert refused.returncode != 0
    assert "LLAMA_SWAP_CONFIG: 'gpu2' is not a GPU of LLAMA_SWAP_URL (it names gpu0, gpu1)" in (
        refused.stderr
    )


@pytest.fixture
def started(monkeypatch) -> dict[str, str]:
    monkeypatch.setenv("LLAMA_SWAP_URL", "gpu0=http://127.0.0.1:9001,gpu1=http://127.0.0.1:9002")
    monkeypatch.setenv("LLAMA_SWAP_CONFIG", "gpu0=/srv/a.yaml,gpu1=/srv/b.yaml")
    env: dict[str, str] = {}
    monkeypatch.setattr(os, "execve", lambda path, argv, given: env.update(given))
    return env


@pytest.mark.django_db
def test_a_gpus_dispatcher_gets_its_own_config_only(settings, started):
    settings.LLAMA_SWAP_CONFIGS = paths("gpu0=/srv/a.yaml,gpu1=/srv/b.yaml")
    call_command("dispatcher", gpu="gpu1", stdout=io.StringIO())
    assert started["LLAMA_SWAP_CONFIG"] == "gpu1=/srv/b.yaml"


@pytest.mark.django_db
def test_dispatcher_config_names_the_file_for_its_gpu(settings, started):
    settings.LLAMA_SWAP_CONFIGS = ConfigPaths()
    call_command("dispatcher", gpu="gpu1", config="/srv/c.yaml", stdout=io.StringIO())
    assert started["LLAMA_SWAP_CONFIG"] == "gpu1=/srv/c.yaml"
    with pytest.raises(CommandError, match="--config: LLAMA_SWAP_CONFIG: entry 2"):
        call_command("dispatcher", gpu="gpu1", config="/srv/c.yaml,x", stdout=io.StringIO())


@pytest.mark.django_db
def test_a_dispatcher_without_a_config_passes_none_on(settings, started):
    settings.LLAMA_SWAP_CONFIGS = ConfigPaths()
    call_command("dispatcher", gpu="gpu0", stdout=io.StringIO())
    assert "LLAMA_SWAP_CONFIG" not in started


def test_make_run_gives_each_simulator_its_gpus_config(settings, monkeypatch):
    from queueapp.management.commands import run_all

    monkeypatch.setenv("SIMULATED_GPUS", "2")
    settings.LLAMA_SWAP_CONFIGS = paths(f"gpu1={STUDIO}")
    started: list[list[str]] = []
    run_all.Command()._start_simulators(
        lambda name, argv, **kwargs: started.append(argv), sys.executable, 9400
    )
    demo, studio = started
    # gpu0 serves the demo models as before; gpu1 its config's, with its routing.
    assert "--config" not in demo and "--accept-any-model" in demo
    assert studio[studio.index("--config") + 1] == STUDIO
    assert "--accept-any-model" not in studio and "--model" not in studio
    # The simulator takes that command line: the config's models, no others.
    from queueapp.upstream.simulator.cli import build_parser, simulator_from_args

    simulator = simulator_from_args(build_parser().parse_args(studio[3:]))
    assert sorted(simulator.models) == [
        "chat-small",
        "embed-small",
        "image-xl",
        "tts-kokoro",
        "video-wan",
    ]
