"""The names the simulator answers to, as llama-swap v250 registers them
(internal/config/load.go, macros.go): a model's id, its aliases and each
`filters.setParamsByID` key, macros expanded; a key that is another model's
id, or another model's name, refuses the config."""

from __future__ import annotations

import httpx
import pytest
import yaml

from queueapp.upstream.simulator.config import ConfigError, parse_config
from tests.upstream.helpers import chat

CONFIG = """
macros:
  fast: "${MODEL_ID}:fast"
models:
  chat-a:
    aliases: [chat]
    filters:
      setParamsByID:
        "${MODEL_ID}:high": {temperature: 1.0}
        "${fast}": {temperature: 0.1}
  image:
    cmd: sd-server
"""


def test_every_name_llama_swap_registers_runs_as_its_model_with_no_second_load(make_sim):
    sim = make_sim(
        config=parse_config(yaml.safe_load(CONFIG)),
        models={"chat-a": 0.01, "image": 0.01},
        swap_seconds=0.01,
    )
    for name in ("chat-a", "chat", "chat-a:high", "chat-a:fast"):
        answer = httpx.post(f"{sim.url}/v1/chat/completions", json=chat(name), timeout=10)
        assert answer.status_code == 200, (name, answer.text)
    log = [entry for entry in sim.log() if entry["status"] == 200]
    assert [entry["model"] for entry in log] == ["chat-a"] * 4
    assert [entry["swapped"] for entry in log] == [True, False, False, False]
    unknown = httpx.post(f"{sim.url}/v1/chat/completions", json=chat("chat-b"), timeout=10)
    assert unknown.status_code == 404


# llama-swap's internal/config/model_config_test.go, re-expressed: the
# config, then the names of model1 it registers, or the error it refuses with.
SET_PARAMS_CASES = {
    "TestConfig_SetParamsByIDAutoAlias": (
        "models: {model1: {filters: {setParamsByID: "
        '{"${MODEL_ID}:high": {reasoning_effort: high}, '
        '"${MODEL_ID}:low": {reasoning_effort: low}}}}}',
        ("model1:high", "model1:low"),
    ),
    "TestConfig_SetParamsByIDAutoAliasConflictWithModelID": (
        "models: {model1: {filters: {setParamsByID: {model2: {}}}}, model2: {}}",
        "conflicts with an existing model ID",
    ),
    "TestConfig_SetParamsByIDAutoAliasConflictWithOtherModel": (
        'models: {model1: {filters: {setParamsByID: {"shared-alias": {}}}}, '
        'model2: {filters: {setParamsByID: {"shared-alias": {}}}}}',
        "duplicate alias",
    ),
}


@pytest.mark.parametrize(("text", "expected"), SET_PARAMS_CASES.values(), ids=SET_PARAMS_CASES)
def test_set_params_keys_as_llama_swaps_own_tests_have_them(text, expected):
    if isinstance(expected, str):
        with pytest.raises(ConfigError, match=expected):
            parse_config(yaml.safe_load(text))
    else:
        assert parse_config(yaml.safe_load(text)).models["model1"].aliases == expected


def test_a_models_own_id_or_alias_as_a_set_params_key_adds_no_name():
    # Its own id is no conflict, nor a second name for it.
    own = "models: {a: {aliases: [x], filters: {setParamsByID: {a: {}, x: {}}}}}"
    assert parse_config(yaml.safe_load(own)).models["a"].aliases == ("x",)
