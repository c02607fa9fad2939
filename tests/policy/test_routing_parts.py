"""`routing_parts`: what the GPU's row keeps of llama-swap's config builds
the same routing as the whole config, and is JSON."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import yaml

from queueapp.policy.routing import evictions, routing_from_config, routing_parts

STUDIO = Path(__file__).resolve().parents[2] / "fixtures" / "llama-swap" / "studio.yaml"

GROUPS = """
models:
  a: {cmd: run-a, aliases: [alpha], concurrencyLimit: 2, filters: {setParamsByID: {a-hot: {t: 1}}}}
  b: {cmd: run-b, ttl: 60}
  c: {cmd: run-c}
  d: {cmd: run-d}
groups:
  pair: {swap: false, exclusive: false, members: [a, b]}
  keep: {persistent: true, members: [c]}
"""

ODD_VALUES = """
models:
  a: {cmd: run-a}
  b: {cmd: run-b}
routing:
  router:
    use: group
    settings:
      groups:
        g: {members: [a, b], swap: false, since: 2026-01-01, weight: .nan, tags: !!set {x}}
"""


def studio() -> dict:
    return yaml.safe_load(STUDIO.read_text())


def every_eviction(config) -> dict:
    names = [*config.models, *config.aliases]
    return {
        (frozenset(running), requested): evictions(config, frozenset(running), requested)
        for size in range(3)
        for running in itertools.combinations(config.models, size)
        for requested in names
    }


@pytest.mark.parametrize(
    "config",
    [studio(), yaml.safe_load(GROUPS), yaml.safe_load(ODD_VALUES)],
    ids=["studio", "groups", "odd-values"],
)
def test_the_parts_kept_build_the_same_routing_through_json(config):
    kept = json.loads(json.dumps(routing_parts(config), allow_nan=False))
    rebuilt = routing_from_config(kept)
    whole = routing_from_config(config)
    assert rebuilt == whole
    assert every_eviction(rebuilt) == every_eviction(whole)


def test_commands_and_parameters_are_not_kept():
    kept = routing_parts(yaml.safe_load(GROUPS))
    assert kept["models"]["a"] == {
        "aliases": ["alpha"],
        "concurrencyLimit": 2,
        "filters": {"setParamsByID": {"a-hot": {}}},
    }
    assert kept["models"]["b"] == {} and "cmd" not in json.dumps(kept)
    assert set(kept) == {"models", "groups"}
