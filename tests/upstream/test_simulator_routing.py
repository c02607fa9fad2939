"""The simulator's routing engines and config reader, as plain functions.

Cases marked "llama-swap" re-express, as data, test cases of mostlygeek/llama-swap v250:
internal/router/group_test.go, internal/router/matrix_test.go, internal/matrix/dsl_test.go.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from queueapp.upstream.simulator.config import ConfigError, parse_config
from queueapp.upstream.simulator.routing import (
    Group,
    GroupRouter,
    MatrixRouter,
    RoutingError,
)


def matrix(sets: dict[str, str], costs: dict[str, int] | None = None, **kw: Any) -> MatrixRouter:
    models = kw.pop("models", ["a", "b", "c", "d", "e", "target"])
    return MatrixRouter.build(
        list(sets.items()), vars=kw.pop("vars", {}), evict_costs=costs or {}, models=models
    )


def groups(**spec: Group) -> GroupRouter:
    return GroupRouter.build(spec, ["a", "b", "c", "d"])


# -- group engine --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "target", "running", "evict"),
    [
        # llama-swap SwapStopsPrevious: a swap group stops its sibling.
        ({"g": Group(("a", "b"))}, "b", ["a"], ["a"]),
        # llama-swap NonSwapGroup_NoStop
        ({"g": Group(("a", "b"), swap=False, exclusive=False)}, "b", ["a"], []),
        # llama-swap CrossGroupExclusive
        ({"g1": Group(("a",)), "g2": Group(("b",))}, "b", ["a"], ["a"]),
        # llama-swap CrossGroupNonExclusiveParallel
        (
            {"g1": Group(("a",), exclusive=False), "g2": Group(("b",), exclusive=False)},
            "b",
            ["a"],
            [],
        ),
        # llama-swap PersistentNotEvicted
        (
            {"persist": Group(("a",), exclusive=False, persistent=True), "o": Group(("b",))},
            "b",
            ["a"],
            [],
        ),
        # llama-swap NonExclusiveDoesNotUnloadExclusive: the quirk.
        ({"g1": Group(("a",)), "g2": Group(("b",), exclusive=False)}, "b", ["a"], []),
        # The rules hold for a target already running, too.
        ({"g1": Group(("a",)), "g2": Group(("b",), exclusive=False)}, "a", ["a", "b"], ["b"]),
    ],
)
def test_group_engine_evicts_as_llama_swap_does(
    spec: dict[str, Group], target: str, running: list[str], evict: list[str]
) -> None:
    assert groups(**spec).eviction_for(target, running) == evict


def test_models_in_no_group_form_an_exclusive_swapping_default_group() -> None:
    router = groups(g=Group(("a",), exclusive=False))
    assert router.eviction_for("c", ["a", "d"]) == ["a", "d"]
    assert router.eviction_for("a", ["c", "d"]) == []


def test_a_model_in_two_groups_is_refused() -> None:
    with pytest.raises(RoutingError, match="used in multiple groups"):
        groups(g1=Group(("a",)), g2=Group(("a",)))


# -- matrix engine -------------------------------------------------------------------------


def test_matrix_ties_go_to_the_first_set_defined() -> None:
    # llama-swap TestMatrixSolver_TieBreakDefinitionOrder, seen through what is evicted.
    router = matrix({"first": "a & b", "second": "a & c"})
    assert router.eviction_for("a", ["b", "c"]) == ["c"]
    assert matrix({"first": "a & c", "second": "a & b"}).eviction_for("a", ["b", "c"]) == ["b"]


def test_matrix_evict_costs_keep_the_dear_model() -> None:
    # llama-swap TestMatrixSolver_EvictCostsPreferred
    router = matrix({"a_with_c": "a & c", "a_with_b": "a & b"}, {"b": 10, "c": 1})
    assert router.eviction_for("a", ["b", "c"]) == ["c"]
    assert matrix({"a_with_c": "a & c", "a_with_b": "a & b"}).eviction_for("a", ["b", "c"]) == ["b"]


def test_matrix_costs_add_up_over_the_models_a_set_leaves_out() -> None:
    sets = {"keep_bc": "a & b & c", "keep_d": "a & d"}
    assert matrix(sets, {"d": 3}).eviction_for("a", ["b", "c", "d"]) == ["b", "c"]  # 2 < 3
    assert matrix(sets, {"d": 1}).eviction_for("a", ["b", "c", "d"]) == ["d"]  # 1 < 2
    # 2 ties 2: the first set defined wins, whichever it is.
    assert matrix(sets, {"d": 2}).eviction_for("a", ["b", "c", "d"]) == ["d"]
    swapped = {"keep_d": "a & d", "keep_bc": "a & b & c"}
    assert matrix(swapped, {"d": 2}).eviction_for("a", ["b", "c", "d"]) == ["b", "c"]


def test_matrix_references_reuse_another_set() -> None:
    # llama-swap TestProgram_References: mega = (g | q | m) & v & e
    router = matrix(
        {"llms": "g | q | m", "with_tts": "+llms & v", "mega": "+with_tts & e"},
        models=["g", "q", "m", "v", "e"],
    )
    assert router.eviction_for("e", ["q", "v"]) == []
    assert router.eviction_for("e", ["g", "q", "v"]) == ["q"]


def test_matrix_and_binds_tighter_than_or() -> None:
    # llama-swap TestProgram_Expressions "precedence": a | b & c is a | (b & c)
    router = matrix({"s": "a | b & c"})
    assert router.eviction_for("c", ["b"]) == []
    assert router.eviction_for("c", ["a"]) == ["a"]
    assert matrix({"s": "(a | b) & c"}).eviction_for("c", ["a"]) == []


def test_matrix_keeps_a_running_target_and_stops_nothing() -> None:
    assert matrix({"s": "a & b"}).eviction_for("a", ["a", "c"]) == []


def test_a_model_in_no_set_runs_alone() -> None:
    # llama-swap TestProgram_TargetAbsent
    assert matrix({"known": "a & b"}).eviction_for("target", ["a", "b"]) == ["a", "b"]


def test_a_superset_combination_wins_over_its_subset() -> None:
    # llama-swap TestProgram_DominatedProjection and TestProgram_OverlappingReferences
    assert matrix({"p": "target & (a | (a & b))"}).eviction_for("target", ["a", "b"]) == []
    router = matrix({"base": "a & b", "extended": "target & +base & b"})
    assert router.eviction_for("target", ["a", "b"]) == []


def test_a_referenced_set_comes_first_in_program_order() -> None:
    # "later" is defined first but references "early", so "early" is tried first.
    router = matrix({"later": "a & c | +early", "early": "a & b"})
    assert router.eviction_for("a", ["b", "c"]) == ["c"]


def test_matrix_vars_name_models() -> None:
    router = matrix({"s": "x & b"}, {"x": 4}, vars={"x": "a"})
    assert router.eviction_for("b", ["a", "c"]) == ["c"]


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        ({"s": "a &"}, "unexpected token"),
        ({"s": "(a | b"}, "missing closing parenthesis"),
        ({"s": "a b"}, "after expression"),
        ({"s": "a & zz"}, "unknown var or model 'zz'"),
        ({"s": "a & +nope"}, "undefined set 'nope'"),
        ({"x": "+y", "y": "+x"}, "circular reference"),
        ({"s": "a & $"}, "position"),
        ({"s": "  "}, "empty DSL expression"),
    ],
)
def test_a_bad_matrix_is_refused(sets: dict[str, str], message: str) -> None:
    with pytest.raises(RoutingError, match=message.replace("(", r"\(").replace("$", r"\$")):
        matrix(sets)


# -- the config ----------------------------------------------------------------------------

MODELS = "models: {a: {aliases: [alpha]}, b: {}, c: {concurrencyLimit: 2}}\n"


def config(text: str) -> Any:
    return parse_config(yaml.safe_load(MODELS + text))


def test_the_group_engine_is_the_default() -> None:
    swap = config("")
    assert swap.engine == "group"
    assert swap.router.eviction_for("a", ["b"]) == ["b"]
    assert swap.models["c"].concurrency_limit == 2
    assert swap.models["b"].concurrency_limit == 10  # fifo.go defaultConcurrencyLimit
    assert swap.real_model("alpha") == "a"


@pytest.mark.parametrize(
    "text",
    [
        "groups: {g: {exclusive: false, members: [a, b]}}\n",
        "routing: {router: {settings: {groups: {g: {exclusive: false, members: [a, b]}}}}}\n",
        "routing: {router: {use: group, settings: {groups: {g: {exclusive: false, "
        "members: [a, b]}}, matrix: {sets: {s: a & c}}}}}\n",
    ],
)
def test_groups_are_read_from_the_legacy_key_or_routing(text: str) -> None:
    swap = config(text)
    assert swap.engine == "group"
    assert swap.router.eviction_for("a", ["b", "c"]) == ["b"]  # g swaps, is not exclusive
    assert swap.router.eviction_for("c", ["a"]) == ["a"]  # c: the default group, exclusive


@pytest.mark.parametrize(
    "text",
    [
        "matrix: {sets: {s: a & c}}\n",
        "routing: {router: {use: matrix, settings: {matrix: {sets: {s: a & c}}}}}\n",
    ],
)
def test_a_matrix_is_read_from_the_legacy_key_or_routing(text: str) -> None:
    swap = config(text)
    assert swap.engine == "matrix"
    assert swap.router.eviction_for("a", ["b", "c"]) == ["b"]


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("groups: {g: {members: [a]}}\nrouting: {router: {use: group}}\n", "routing.router"),
        ("matrix: {sets: {s: a}}\nrouting: {router: {use: matrix}}\n", "routing.router"),
        ("routing: {router: {use: mesh}}\n", "routing.router.use"),
        ("routing: {router: {use: matrix}}\n", "routing.router.use"),
        ("routing: {scheduler: {use: lifo}}\n", "routing.scheduler.use"),
        ("matrix: {sets: {s: a}}\ngroups: {g: {members: [b]}}\n", "groups"),
        ("groups: {g1: {members: [a]}, g2: {members: [a]}}\n", "groups.g2.members"),
        ("groups: {g: {members: [zz]}}\n", "groups.g.members"),
        ("groups: {g: {swap: maybe, members: [a]}}\n", "groups.g.swap"),
        ("matrix: {sets: {s: a & zz}}\n", "matrix.sets.s"),
        ("matrix: {sets: {}}\n", "matrix.sets"),
        ("matrix: {evict_costs: {a: 0}, sets: {s: a}}\n", "matrix.evict_costs.a"),
        ("matrix: {vars: {x: zz}, sets: {s: a}}\n", "matrix.vars.x"),
    ],
)
def test_a_bad_config_names_the_key_at_fault(text: str, key: str) -> None:
    with pytest.raises(ConfigError, match=f"^{key.replace('.', '[.]')}"):
        config(text)


@pytest.mark.parametrize(
    ("document", "key"),
    [
        ({"models": {}}, "models"),
        ({"models": {"a": {"aliases": ["x"]}, "b": {"aliases": ["x"]}}}, "models.b.aliases"),
        ({"models": {"a": {"concurrencyLimit": -1}}}, "models.a.concurrencyLimit"),
        ({"models": {"a": {"metadata": {"simulator": {"seconds": "x"}}}}}, "models.a.metadata"),
        ([], "config"),
    ],
)
def test_a_bad_models_block_names_the_key_at_fault(document: Any, key: str) -> None:
    with pytest.raises(ConfigError, match=f"^{key.replace('.', '[.]')}"):
        parse_config(document)
