"""llama-swap's matrix engine and its set expressions, predicted by
queueapp/policy/routing.py and queueapp/policy/matrix_dsl.py.

Cases marked with an origin are llama-swap v250's own tests, re-expressed as
data. Models "in flight" in the Go router tests (a swap begun, the process
not yet starting) are running here, as llama-swap counts them.
"""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from queueapp.policy import matrix_dsl
from queueapp.policy.matrix_dsl import AllOf, AnyOf, Leaf, SetRef
from queueapp.policy.routing import (
    MatrixRouting,
    RoutingConfigError,
    evictions,
    routing_from_config,
)

ROUTER_GO = "llama-swap internal/router/matrix_test.go"
DSL_GO = "llama-swap internal/matrix/dsl_test.go"


def with_matrix(
    sets: dict[str, str], models: list[str], *, costs=None, variables=None, aliases=None
) -> dict:
    matrix: dict = {"sets": sets}
    if costs is not None:
        matrix["evict_costs"] = costs
    if variables is not None:
        matrix["vars"] = variables
    aliases = aliases or {}
    return {
        "models": {model: {"aliases": aliases.get(model, [])} for model in models},
        "routing": {"router": {"use": "matrix", "settings": {"matrix": matrix}}},
    }


def product_sets(dimensions: int, choices: int) -> tuple[dict[str, str], list[str]]:
    """DSL_GO productDefinition: target & (model-0-0 | ...) & ... ."""
    models = ["target"]
    alternatives = []
    for dimension in range(dimensions):
        names = [f"model-{dimension}-{choice}" for choice in range(choices)]
        models += names
        alternatives.append("(" + " | ".join(names) + ")")
    return {"large": "target & " + " & ".join(alternatives)}, models


LARGE_SETS, LARGE_MODELS = product_sets(6, 10)
WIDE_MODELS = ["target", *(f"model-{i}" for i in range(70))]

# (origin, sets, models, evict_costs, running, requested, unloaded)
MATRIX_CASES = [
    (
        f"{ROUTER_GO} TestMatrix_SwapEvictsConflicting",
        {"s_a": "a", "s_b": "b"},
        ["a", "b"],
        None,
        {"a"},
        "b",
        {"a"},
    ),
    (
        f"{ROUTER_GO} TestMatrix_CoexistInSet",
        {"s_ab": "a & b"},
        ["a", "b"],
        None,
        {"a"},
        "b",
        set(),
    ),
    (
        f"{ROUTER_GO} TestMatrix_CoexistingSetParallel (first request)",
        {"s_ab": "a & b"},
        ["a", "b"],
        None,
        set(),
        "a",
        set(),
    ),
    (
        f"{ROUTER_GO} TestMatrix_CoexistingSetParallel (second, a in flight)",
        {"s_ab": "a & b"},
        ["a", "b"],
        None,
        {"a"},
        "b",
        set(),
    ),
    (
        f"{ROUTER_GO} TestMatrix_IncompatibleQueues (b while a is in flight)",
        {"s_a": "a", "s_b": "b"},
        ["a", "b"],
        None,
        {"a"},
        "b",
        {"a"},
    ),
    (
        # The Go test asks with nothing running and reads the set's name; with
        # b and c running both sets cost 1 and the first one's keeps b.
        f"{ROUTER_GO} TestMatrixSolver_TieBreakDefinitionOrder (made observable)",
        {"first": "a & b", "second": "a & c"},
        ["a", "b", "c"],
        None,
        {"b", "c"},
        "a",
        {"c"},
    ),
    (
        "the same tie, sets written the other way round",
        {"first": "a & c", "second": "a & b"},
        ["a", "b", "c"],
        None,
        {"b", "c"},
        "a",
        {"b"},
    ),
    (
        f"{ROUTER_GO} TestMatrixSolver_EvictCostsPreferred",
        {"a_with_c": "a & c", "a_with_b": "a & b"},
        ["a", "b", "c"],
        {"b": 10, "c": 1},
        {"b", "c"},
        "a",
        {"c"},
    ),
    (
        f"{DSL_GO} TestProgram_OverlappingReferences",
        {"base": "a & b", "extended": "target & +base & b"},
        ["target", "a", "b"],
        None,
        {"a", "b"},
        "target",
        set(),
    ),
    (
        f"{DSL_GO} TestProgram_NoExpansionLimit",
        LARGE_SETS,
        [*LARGE_MODELS, "outside"],
        None,
        {f"model-{dimension}-9" for dimension in range(6)} | {"outside"},
        "target",
        {"outside"},
    ),
    (
        f"{DSL_GO} TestProgram_MoreThan64RelevantModels",
        {"wide": " & ".join(WIDE_MODELS)},
        [*WIDE_MODELS, "outside"],
        None,
        set(WIDE_MODELS[1:]) | {"outside"},
        "target",
        {"outside"},
    ),
    (
        f"{DSL_GO} TestProgram_DominatedProjection",
        {"preferred": "target & (a | (a & b))"},
        ["target", "a", "b"],
        None,
        {"a", "b"},
        "target",
        set(),
    ),
    (
        f"{DSL_GO} TestProgram_TargetAbsent (a model in no set runs alone)",
        {"known": "a & b"},
        ["a", "b", "missing"],
        None,
        {"a", "b"},
        "missing",
        {"a", "b"},
    ),
    (
        "a model already running unloads nothing, even one no set allows beside it",
        {"s_a": "a", "s_b": "b"},
        ["a", "b"],
        None,
        {"a", "b"},
        "a",
        set(),
    ),
    (
        "a set permits any subset of itself",
        {"all": "a & b & c"},
        ["a", "b", "c", "d"],
        None,
        {"c", "d"},
        "a",
        {"d"},
    ),
    (
        "the cheapest combination across alternatives wins",
        {"standard": "(g | q) & v", "big": "l"},
        ["g", "q", "v", "l"],
        {"v": 50},
        {"q", "v", "l"},
        "g",
        {"q", "l"},
    ),
    (
        # Program order puts a +ref'd set before the set naming it, though
        # the YAML names "big" first; both choices cost 1.
        "on a tie a referenced set comes before the set that references it",
        {"big": "t & b | +small", "small": "t & a"},
        ["t", "a", "b"],
        None,
        {"a", "b"},
        "t",
        {"b"},
    ),
    (
        "within one set a tie goes to the earlier alternative",
        {"one": "t & b | t & a"},
        ["t", "a", "b"],
        None,
        {"a", "b"},
        "t",
        {"a"},
    ),
]


@pytest.mark.parametrize(
    ("sets", "models", "costs", "running", "requested", "unloaded"),
    [pytest.param(*case[1:], id=case[0]) for case in MATRIX_CASES],
)
def test_the_matrix_engine_unloads_what_llama_swap_unloads(
    sets, models, costs, running, requested, unloaded
):
    config = routing_from_config(with_matrix(sets, models, costs=costs))
    assert evictions(config, frozenset(running), requested) == frozenset(unloaded)


def test_vars_name_models_in_sets_and_evict_costs():
    config = routing_from_config(
        with_matrix(
            {"standard": "(g | q) & v"},
            ["gemma", "qwen", "voice"],
            costs={"v": 50},
            variables={"g": "gemma", "q": "qwen", "v": "voice"},
        )
    )
    assert isinstance(config.engine, MatrixRouting)
    assert config.engine.evict_cost("voice") == 50
    assert config.engine.evict_cost("gemma") == 1
    assert evictions(config, frozenset({"qwen", "voice"}), "gemma") == {"qwen"}


def test_an_alias_requested_resolves_to_its_model():
    config = routing_from_config(
        with_matrix({"s": "a", "t": "b"}, ["a", "b"], aliases={"b": ["bee"]})
    )
    assert evictions(config, frozenset({"a"}), "bee") == {"a"}


def test_the_legacy_top_level_matrix_is_read():
    config = routing_from_config(
        {"models": {"a": {}, "b": {}}, "matrix": {"sets": {"ab": "a & b"}}}
    )
    assert evictions(config, frozenset({"a"}), "b") == frozenset()


# (origin, expression, the tree it parses to)
PARSES = [
    (f"{DSL_GO} TestDSL_Tokenize single identifier", "abc", Leaf("abc")),
    (
        f"{DSL_GO} TestDSL_Tokenize identifier with hyphens and dots",
        "model-name.v2",
        Leaf("model-name.v2"),
    ),
    (
        f"{DSL_GO} TestDSL_Tokenize operators and reference",
        "(a | +base) & b",
        AllOf((AnyOf((Leaf("a"), SetRef("base"))), Leaf("b"))),
    ),
    ("& binds tighter than |", "a | b & c", AnyOf((Leaf("a"), AllOf((Leaf("b"), Leaf("c")))))),
    ("letters beyond ASCII and underscores", " qwen_3.5-é ", Leaf("qwen_3.5-é")),
]


@pytest.mark.parametrize(("text", "tree"), [pytest.param(*c[1:], id=c[0]) for c in PARSES])
def test_an_expression_parses_to_its_tree(text, tree):
    assert matrix_dsl.parse_expression(text) == tree


# (origin, sets, relevant models, the combinations of the first set, in order)
EXPANSIONS = [
    (f"{DSL_GO} TestProgram_Expressions single model", {"test": "a"}, "a", ["a"]),
    (f"{DSL_GO} TestProgram_Expressions and", {"test": "a & b"}, "ab", ["ab"]),
    (f"{DSL_GO} TestProgram_Expressions or", {"test": "a | b | c"}, "abc", ["a", "b", "c"]),
    (
        f"{DSL_GO} TestProgram_Expressions cartesian product",
        {"test": "(a | b) & (c | d)"},
        "abcd",
        ["ac", "ad", "bc", "bd"],
    ),
    (
        f"{DSL_GO} TestProgram_Expressions precedence",
        {"test": "a | b & c"},
        "abc",
        ["a", "bc"],
    ),
    (f"{DSL_GO} TestProgram_Expressions deduplicates models", {"test": "a & a"}, "a", ["a"]),
    (
        f"{DSL_GO} TestProgram_References",
        {"mega": "+with_tts & e", "llms": "g | q | m", "with_tts": "+llms & v"},
        "gqmve",
        ["egv", "eqv", "emv"],
    ),
    (
        "a combination inside a later one gives way to it, at the end",
        {"test": "a | b | a & c"},
        "abc",
        ["b", "ac"],
    ),
    (
        "models outside the query are cut away and equal combinations merge",
        {"test": "(a | x) & (b | y)"},
        "ab",
        ["ab"],
    ),
]


@pytest.mark.parametrize(
    ("sets", "relevant", "expected"), [pytest.param(*c[1:], id=c[0]) for c in EXPANSIONS]
)
def test_an_expression_allows_the_combinations_llama_swap_expands(sets, relevant, expected):
    expression_of = {name: matrix_dsl.parse_expression(text) for name, text in sets.items()}
    first = expression_of[next(iter(sets))]
    found = matrix_dsl.combinations(
        first, relevant=frozenset(relevant), expression_of=expression_of
    )
    assert found == [frozenset(each) for each in expected]


# (origin, sets, key at fault, words of the reason)
MATRIX_ERRORS = [
    (f"{DSL_GO} TestDSL_Tokenize empty ref", {"s": "+"}, "s", "expected set name after '+'"),
    (
        f"{DSL_GO} TestDSL_Tokenize invalid character",
        {"s": "a @ b"},
        "s",
        "unexpected character '@'",
    ),
    (f"{DSL_GO} TestProgram_CompileErrors empty expression", {"s": ""}, "s", "empty DSL"),
    (
        f"{DSL_GO} TestProgram_CompileErrors unmatched open paren",
        {"s": "(a"},
        "s",
        "missing closing parenthesis",
    ),
    (
        f"{DSL_GO} TestProgram_CompileErrors unmatched close paren",
        {"s": "a)"},
        "s",
        "unexpected token ')' after expression",
    ),
    (f"{DSL_GO} TestProgram_CompileErrors empty parens", {"s": "()"}, "s", "unexpected token"),
    (
        f"{DSL_GO} TestProgram_CompileErrors unknown model",
        {"s": "missing"},
        "s",
        "unknown var or model 'missing'",
    ),
    (
        f"{DSL_GO} TestProgram_CompileErrors unknown reference",
        {"s": "+missing"},
        "s",
        "references undefined set 'missing'",
    ),
    (
        f"{DSL_GO} TestProgram_CompileErrors reference cycle",
        {"a": "+b", "b": "+a"},
        "a",
        "circular reference",
    ),
    ("a dangling operator", {"s": "a &"}, "s", "unexpected token"),
    ("an alias in a set (llama-swap reads vars and model ids only)", {"s": "al"}, "s", "'al'"),
]


@pytest.mark.parametrize(
    ("sets", "set_name", "reason"), [pytest.param(*c[1:], id=c[0]) for c in MATRIX_ERRORS]
)
def test_a_set_llama_swap_cannot_compile_is_refused_naming_it(sets, set_name, reason):
    config = with_matrix(sets, ["a"], aliases={"a": ["al"]})
    with pytest.raises(RoutingConfigError) as refused:
        routing_from_config(config)
    assert refused.value.key == f"routing.router.settings.matrix.sets.{set_name}"
    assert reason in refused.value.reason


# (why, matrix settings, key at fault, words of the reason)
SETTINGS_ERRORS = [
    ("no sets (llama-swap internal/matrix/program.go)", {"sets": {}}, "sets", "at least one set"),
    (
        "a zero evict cost",
        {"sets": {"s": "a"}, "evict_costs": {"a": 0}},
        "evict_costs.a",
        "positive",
    ),
    (
        "an evict cost for no model",
        {"sets": {"s": "a"}, "evict_costs": {"z": 2}},
        "evict_costs.z",
        "unknown",
    ),
    ("a var naming no model", {"sets": {"s": "a"}, "vars": {"v": "z"}}, "vars.v", "unknown model"),
    ("a var with a bad name", {"sets": {"s": "a"}, "vars": {"v_1": "a"}}, "vars.v_1", "1-32"),
    ("a set that is not text", {"sets": {"s": ["a"]}}, "sets.s", "expression string"),
]


@pytest.mark.parametrize(
    ("matrix", "key", "reason"), [pytest.param(*c[1:], id=c[0]) for c in SETTINGS_ERRORS]
)
def test_matrix_settings_llama_swap_refuses_are_refused_naming_the_key(matrix, key, reason):
    config = {
        "models": {"a": {}},
        "routing": {"router": {"use": "matrix", "settings": {"matrix": matrix}}},
    }
    with pytest.raises(RoutingConfigError) as refused:
        routing_from_config(config)
    assert refused.value.key == f"routing.router.settings.matrix.{key}"
    assert reason in refused.value.reason


MODELS = ["a", "b", "c", "d"]
leaves = st.sampled_from(MODELS)
expressions = st.recursive(
    leaves,
    lambda inner: st.tuples(inner, st.sampled_from([" & ", " | "]), inner).map(
        lambda t: f"({t[0]}{t[1]}{t[2]})"
    ),
    max_leaves=6,
)


def every_combination(expression, expression_of) -> list[frozenset[str]]:
    """The plain cartesian expansion, nothing cut or merged, in expression order."""
    if isinstance(expression, Leaf):
        return [frozenset({expression.model})]
    if isinstance(expression, SetRef):
        return every_combination(expression_of[expression.set_name], expression_of)
    if isinstance(expression, AnyOf):
        return [
            c for choice in expression.choices for c in every_combination(choice, expression_of)
        ]
    joined = [frozenset()]
    for part in expression.parts:
        joined = [
            left | right for left in joined for right in every_combination(part, expression_of)
        ]
    return joined


@given(
    sets=st.lists(expressions, min_size=1, max_size=3),
    references=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2)), max_size=2),
    running=st.frozensets(leaves),
    requested=leaves,
    costs=st.dictionaries(leaves, st.integers(1, 5)),
)
def test_the_matrix_engine_agrees_with_a_plain_expansion_in_program_order(
    sets, references, running, requested, costs
):
    texts = {f"s{i}": text for i, text in enumerate(sets)}
    for referrer, referenced in references:
        # Only later sets name earlier ones: no cycles, yet program order moves.
        if referenced < referrer < len(sets):
            texts[f"s{referrer}"] += f" | +s{referenced}"
    config = routing_from_config(with_matrix(texts, MODELS, costs=costs))
    assert isinstance(config.engine, MatrixRouting)
    unloaded = evictions(config, running, requested)

    if requested in running:
        assert unloaded == frozenset()
        return
    expression_of = {each.name: each.expression for each in config.engine.sets}
    candidates = [
        combination
        for each in config.engine.sets
        for combination in every_combination(each.expression, expression_of)
        if requested in combination
    ]
    if not candidates:
        assert unloaded == running
        return
    cost = [sum(config.engine.evict_cost(m) for m in running - c) for c in candidates]
    assert unloaded == running - candidates[cost.index(min(cost))]
