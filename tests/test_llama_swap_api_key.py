"""`LLAMA_SWAP_API_KEY` and `LLAMA_SWAP_API_KEY_FILE` read (gpusched/upstreams.py):
one key for every GPU or one per GPU, from the variable or a file, and a
clear error for every value that cannot be read, none of which shows a key."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import call_command

from gpusched.upstreams import (
    ApiKeys,
    ApiKeysInvalid,
    api_keys_from_environment,
    bearer_headers,
    parse_api_keys,
)
from queueapp.management.commands import run_all

GPUS = ["gpu0", "gpu1"]
SECRET = "sk-Very-Secret-0123"


def keys(text: str) -> ApiKeys:
    return parse_api_keys(text, gpu_names=GPUS, source="LLAMA_SWAP_API_KEY")


def refusal(text: str) -> str:
    with pytest.raises(ApiKeysInvalid) as refused:
        keys(text)
    message = str(refused.value)
    assert message.startswith("LLAMA_SWAP_API_KEY")
    return message


def test_one_key_is_sent_to_every_gpu():
    parsed = keys(f"  {SECRET}\n")
    assert [parsed.key_for(gpu) for gpu in [*GPUS, "gpu7"]] == [SECRET] * 3


def test_keys_by_name_go_to_their_gpu_and_a_gpu_without_one_gets_none():
    parsed = keys(f"gpu1 = {SECRET}")
    assert (parsed.key_for("gpu0"), parsed.key_for("gpu1")) == (None, SECRET)
    both = keys("gpu0=a1, gpu1=b2==")
    assert (both.key_for("gpu0"), both.key_for("gpu1")) == ("a1", "b2==")


def test_the_header_is_bearer_and_absent_without_a_key():
    assert bearer_headers(SECRET) == {"Authorization": f"Bearer {SECRET}"}
    assert bearer_headers(None) == {}


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "is empty"),
        ("gpu0=a,,gpu1=b", "entry 2 is empty"),
        (f"gpu0=a,{SECRET}", "entry 2 is not NAME=KEY"),
        (f"gpu9={SECRET}", "entry 1 names no GPU of LLAMA_SWAP_URL (it names gpu0, gpu1)"),
        (f"{SECRET}==", "entry 1 names no GPU"),
        ("gpu0=a,gpu0=b", "the GPU 'gpu0' is given twice"),
        ("gpu0=", "the key of gpu0 is empty"),
        ("gpu0=has space", "holds a space"),
        ("ключ", "not printable ASCII"),
    ],
)
def test_a_malformed_value_is_refused_with_a_reason(text, says):
    assert says in refusal(text)


def test_no_refusal_shows_the_key():
    for text in [f"gpu9={SECRET}", f"{SECRET}==", f"gpu0=a,{SECRET}", f"gpu0={SECRET} x"]:
        assert "Secret" not in refusal(text)


def test_the_settings_repr_names_no_key():
    assert SECRET not in repr(keys(SECRET)) + repr(keys(f"gpu0={SECRET}"))
    assert repr(keys(f"gpu0={SECRET}")) == "ApiKeys(<a key for gpu0>)"


def test_unset_or_empty_variables_mean_no_key():
    for environ in [{}, {"LLAMA_SWAP_API_KEY": " ", "LLAMA_SWAP_API_KEY_FILE": ""}]:
        parsed = api_keys_from_environment(environ, gpu_names=GPUS)
        assert not parsed and parsed.key_for("gpu0") is None


def test_the_file_holds_the_same_format_lines_or_commas(tmp_path):
    path = tmp_path / "llama-swap-key"
    path.write_text(f"gpu0={SECRET}\ngpu1=other\n")
    parsed = api_keys_from_environment({"LLAMA_SWAP_API_KEY_FILE": str(path)}, gpu_names=GPUS)
    assert (parsed.key_for("gpu0"), parsed.key_for("gpu1")) == (SECRET, "other")
    path.write_text(f"{SECRET}\n")  # a systemd credential: the key and a newline
    parsed = api_keys_from_environment({"LLAMA_SWAP_API_KEY_FILE": str(path)}, gpu_names=GPUS)
    assert parsed.key_for("gpu1") == SECRET


def test_a_file_that_cannot_be_read_or_holds_garbage_is_refused(tmp_path):
    missing = tmp_path / "missing"
    with pytest.raises(ApiKeysInvalid, match=f"LLAMA_SWAP_API_KEY_FILE: cannot read {missing}"):
        api_keys_from_environment({"LLAMA_SWAP_API_KEY_FILE": str(missing)}, gpu_names=GPUS)
    bad = tmp_path / "bad"
    bad.write_text(f"gpu3={SECRET}")
    with pytest.raises(ApiKeysInvalid) as refused:
        api_keys_from_environment({"LLAMA_SWAP_API_KEY_FILE": str(bad)}, gpu_names=GPUS)
    assert str(refused.value).startswith(f"LLAMA_SWAP_API_KEY_FILE ({bad}): entry 1 names no GPU")
    assert SECRET not in str(refused.value)


def test_both_variables_set_is_refused(tmp_path):
    path = tmp_path / "key"
    path.write_text(SECRET)
    with pytest.raises(ApiKeysInvalid, match="are both set; set one of them"):
        api_keys_from_environment(
            {"LLAMA_SWAP_API_KEY": SECRET, "LLAMA_SWAP_API_KEY_FILE": str(path)}, gpu_names=GPUS
        )


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


@pytest.mark.e2e  # starts a process
def test_a_bad_setting_stops_the_start_with_its_reason(tmp_path):
    urls = "gpu0=http://127.0.0.1:9001,gpu1=http://127.0.0.1:9002"
    refused = manage("check", LLAMA_SWAP_URL=urls, LLAMA_SWAP_API_KEY=f"gpu2={SECRET}")
    assert refused.returncode != 0
    assert "LLAMA_SWAP_API_KEY: entry 1 names no GPU of LLAMA_SWAP_URL (it names gpu0, gpu1)" in (
        refused.stderr
    )
    assert SECRET not in refused.stdout + refused.stderr
    # Without LLAMA_SWAP_URL the GPUs are make run's simulators.
    simulated = manage("check", SIMULATED_GPUS="2", LLAMA_SWAP_API_KEY=f"gpu1={SECRET}")
    assert simulated.returncode == 0, simulated.stderr


@pytest.mark.e2e  # starts a process
def test_the_settings_printed_show_no_key():
    printed = manage("diffsettings", "--all", LLAMA_SWAP_API_KEY=SECRET)
    assert printed.returncode == 0, printed.stderr
    assert "LLAMA_SWAP_API_KEYS = ApiKeys(<one key for every GPU>)" in printed.stdout
    assert SECRET not in printed.stdout + printed.stderr


def test_make_run_gives_each_simulator_its_gpus_key(settings, monkeypatch):
    def simulators_started(count: str, text: str) -> list[list[str]]:
        monkeypatch.setenv("SIMULATED_GPUS", count)
        settings.LLAMA_SWAP_API_KEYS = keys(text)
        started: list[list[str]] = []
        run_all.Command()._start_simulators(
            lambda name, argv, **kwargs: started.append(argv), sys.executable, 9400
        )
        return started

    def given(argv: list[str]) -> str | None:
        return argv[argv.index("--api-key") + 1] if "--api-key" in argv else None

    assert [given(argv) for argv in simulators_started("2", f"gpu1={SECRET}")] == [None, SECRET]
    assert [given(argv) for argv in simulators_started("2", SECRET)] == [SECRET, SECRET]


@pytest.mark.django_db
def test_a_gpus_dispatcher_gets_its_own_key_only(settings, monkeypatch):
    monkeypatch.setenv("LLAMA_SWAP_URL", "gpu0=http://127.0.0.1:9001,gpu1=http://127.0.0.1:9002")
    monkeypatch.setenv("LLAMA_SWAP_API_KEY_FILE", "/run/credentials/llama-swap-key")
    settings.LLAMA_SWAP_API_KEYS = keys(f"gpu0=other,gpu1={SECRET}")
    started: dict[str, str] = {}

    def execve(path: str, argv: list[str], env: dict[str, str]) -> None:
        started.update(env)

    monkeypatch.setattr(os, "execve", execve)
    call_command("dispatcher", gpu="gpu1", stdout=io.StringIO())
    assert started["LLAMA_SWAP_URL"] == "gpu1=http://127.0.0.1:9002"
    assert started["LLAMA_SWAP_API_KEY"] == f"gpu1={SECRET}"
    assert "LLAMA_SWAP_API_KEY_FILE" not in started
