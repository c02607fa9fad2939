"""llama-swap's macros in a model's config, and the names it answers to: its
id, its aliases and each `filters.setParamsByID` key, macros expanded
(internal/config/load.go and macros.go, llama-swap v250)."""

from __future__ import annotations

import pytest
import yaml

from queueapp.policy.config_macros import alias_names, expand_macros, set_params_names
from queueapp.policy.routing import (
    RoutingConfigError,
    resolve,
    routing_from_config,
    routing_parts,
)

CONFIG = """
macros:
  fast: "${MODEL_ID}:fast"
models:
  chat-a:
    aliases: ["${MODEL_ID}-latest", chat]
    filters:
      setParamsByID:
        "${MODEL_ID}:high": {temperature: 1.0}
        "${fast}": {temperature: 0.1}
        chat-a: {temperature: 0.7}
  image:
    cmd: sd-server
"""


def test_macros_expand_the_models_own_first_then_nested_ones_leaving_runtime_ones():
    macros = {"server": "llama-server --port ${PORT} ${slots}", "slots": "-np ${n}", "n": 4}
    assert (
        expand_macros("${server} -m ${MODEL_ID}.gguf ${env.HOME}", macros, model_id="chat")
        == "llama-server --port ${PORT} -np 4 -m chat.gguf ${env.HOME}"
    )
    assert expand_macros("${flag}", {"flag": True}, model_id="m") == "true"


def test_aliases_and_set_params_keys_have_their_macros_expanded():
    config = yaml.safe_load(CONFIG)
    entry = config["models"]["chat-a"]
    assert alias_names(config, "chat-a", entry) == ["chat-a-latest", "chat"]
    assert set_params_names(config, "chat-a", entry) == ["chat-a:high", "chat-a:fast", "chat-a"]
    assert set_params_names(config, "image", config["models"]["image"]) == []


def test_the_routing_answers_every_name_llama_swap_registers_and_stores_them_expanded():
    config = yaml.safe_load(CONFIG)
    routing = routing_from_config(config)
    for name in ("chat-a", "chat-a-latest", "chat", "chat-a:high", "chat-a:fast"):
        assert resolve(routing, name) == "chat-a"
    # The row keeps the names, not the macros: a process without the file
    # builds the same routing from it.
    parts = routing_parts(config)
    assert parts["models"]["chat-a"]["filters"] == {
        "setParamsByID": {"chat-a:high": {}, "chat-a:fast": {}, "chat-a": {}}
    }
    assert routing_from_config(parts).aliases == routing.aliases


def test_two_set_params_keys_that_resolve_to_one_name_are_refused_as_llama_swap_does():
    config = {"models": {"m": {"filters": {"setParamsByID": {"${MODEL_ID}": {}, "m": {}}}}}}
    with pytest.raises(RoutingConfigError, match="resolve to the same name"):
        routing_from_config(config)
