"""The policy's predicted evictions against the simulator's own, on drawn configs.

`queueapp.policy.routing.evictions` predicts what llama-swap unloads; the simulator's
`RoutedGpu` unloads with routing code written apart from it (it must not import the
policy's rule). Both stand for llama-swap v250, so on any config both accept and any
sequence of requests they must unload the same models and keep the same ones running.

The simulator is driven through `RoutedGpu.admit`, its real admission path, in-process:
each request is closed as soon as it is admitted, so no busy model makes one wait.
"""

from __future__ import annotations

from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from queueapp.policy.routing import evictions, resolve, routing_from_config
from queueapp.upstream.simulator.config import parse_config
from queueapp.upstream.simulator.residency import RoutedGpu

MODEL_IDS = ("a", "b", "c", "d", "e", "f")
VAR_NAMES = ("v0", "v1", "v2")


@st.composite
def model_table(draw: st.DrawFn) -> dict[str, dict[str, Any]]:
    # Few models most often: a tie or a clash needs the same models requested again.
    count = draw(st.sampled_from([2, 3, 3, 3, 4, 4, 5, 6]))
    models: dict[str, dict[str, Any]] = {}
    for model_id in MODEL_IDS[:count]:
        aliases = draw(st.lists(st.sampled_from(["x", "y"]), max_size=2, unique=True))
        models[model_id] = {"aliases": [f"{model_id}-{a}" for a in aliases]} if aliases else {}
    return models


@st.composite
def group_settings(draw: st.DrawFn, model_ids: list[str]) -> dict[str, Any]:
    # Each model in one group or in none (-1): members are disjoint by construction.
    home = draw(st.lists(st.integers(-1, 2), min_size=len(model_ids), max_size=len(model_ids)))
    groups: dict[str, Any] = {}
    for index in sorted(set(home) - {-1}):
        members = [m for m, h in zip(model_ids, home, strict=True) if h == index]
        spec: dict[str, Any] = {"members": members}
        for flag in ("swap", "exclusive", "persistent"):
            value = draw(st.sampled_from([None, True, False]))  # None: llama-swap's default
            if value is not None:
                spec[flag] = value
        groups[f"g{index}"] = spec
    return groups


@st.composite
def expression(draw: st.DrawFn, atoms: list[str], depth: int) -> str:
    if depth == 0 or draw(st.booleans()):
        return draw(st.sampled_from(atoms))
    parts = draw(st.lists(expression(atoms, depth - 1), min_size=2, max_size=3))
    # Operators mixed within one level test that `&` binds tighter than `|`.
    text = parts[0]
    for part in parts[1:]:
        text += draw(st.sampled_from([" & ", " | ", "&", "|"])) + part
    return f"({text})" if draw(st.booleans()) else text


@st.composite
def matrix_settings(draw: st.DrawFn, model_ids: list[str]) -> dict[str, Any]:
    var_names = draw(st.lists(st.sampled_from(VAR_NAMES), max_size=len(VAR_NAMES), unique=True))
    variables = {name: draw(st.sampled_from(model_ids)) for name in var_names}
    names = model_ids + var_names
    costed = draw(st.lists(st.sampled_from(names), max_size=3, unique=True))
    matrix: dict[str, Any] = {"sets": {}}
    for index in range(draw(st.integers(1, 4))):
        # `+ref` only to an earlier set: every set stays valid, no cycle.
        refs = [f"+{name}" for name in matrix["sets"]]
        matrix["sets"][f"s{index}"] = draw(expression(names + refs, depth=2))
    if variables:
        matrix["vars"] = variables
    if costed:
        matrix["evict_costs"] = {name: draw(st.integers(1, 3)) for name in costed}
    return matrix


@st.composite
def llama_swap_config(draw: st.DrawFn) -> dict[str, Any]:
    models = draw(model_table())
    model_ids = list(models)
    use = draw(st.sampled_from(["group", "matrix", "matrix"]))  # matrix: more to cover
    legacy = draw(st.booleans())
    if use == "matrix":
        engine = draw(matrix_settings(model_ids))
        if legacy:
            return {"models": models, "matrix": engine}
        router = {"use": "matrix", "settings": {"matrix": engine}}
        return {"models": models, "routing": {"router": router}}
    groups = draw(group_settings(model_ids))
    if legacy:
        return {"models": models, "groups": groups}
    router: dict[str, Any] = {"settings": {"groups": groups}}
    if draw(st.booleans()):
        router["use"] = "group"  # else left unset: llama-swap defaults to it
    return {"models": models, "routing": {"router": router}}


@st.composite
def scenario(draw: st.DrawFn) -> tuple[dict[str, Any], list[tuple[str, bool]]]:
    """A config and its requests: a name (id or alias), and whether its load ends
    before the next request (else the model is still starting then)."""
    config = draw(llama_swap_config())
    names = [
        name
        for model_id, spec in config["models"].items()
        for name in (model_id, *spec.get("aliases", ()))
    ]
    requests = st.tuples(st.sampled_from(names), st.booleans())
    return config, draw(st.lists(requests, min_size=1, max_size=12))


def states_on(gpu: RoutedGpu) -> dict[str, str]:
    """``GET /running``: every model not stopped (starting ones too), by its state."""
    return {entry["model"]: entry["state"] for entry in gpu.running()["running"]}


# A tie the draws seldom reach: keeping b or keeping c costs 1 either way, and the
# first set defined wins (llama-swap internal/matrix/program.go, Solve).
TIE = {
    "models": {"a": {}, "b": {}, "c": {}},
    "matrix": {"sets": {"ab": "a & b", "ac": "a & c", "bc": "b & c"}},
}


@settings(max_examples=200, deadline=None)
@given(scenario())
@example((TIE, [("b", True), ("c", True), ("a", True)]))
def test_policy_predicts_the_simulators_evictions(
    drawn: tuple[dict[str, Any], list[tuple[str, bool]]],
) -> None:
    config, requests = drawn
    routing = routing_from_config(config)
    gpu = RoutedGpu(parse_config(config), models=dict.fromkeys(config["models"], 1.0))
    for seq, (name, load_ends) in enumerate(requests, start=1):
        target = resolve(routing, name)
        states = states_on(gpu)
        before = frozenset(states)
        # A model still starting is a swap in flight: the request joins it and the
        # engine is not asked (llama-swap internal/router/scheduler/fifo.go, step 2).
        joins = states.get(target) == "starting"
        predicted = frozenset() if joins else evictions(routing, before, name)
        entry: dict[str, Any] = {"seq": seq}
        gpu.admit(entry, gpu.real_model(name), seconds=1.0)
        gpu.close(entry, 200, release=True)
        if load_ends:
            gpu.loaded(target)
        after = frozenset(states_on(gpu))
        assert before - after == predicted, (name, sorted(before))
        assert after == (before - predicted) | {target}
