"""llama-swap's group engine and its config, predicted by queueapp/policy/routing.py.

Cases marked with an origin are llama-swap v250's own tests, re-expressed as
(groups, running, requested, unloaded). The Go tests build `GroupConfig`
structs, where an unset flag is false, not YAML's default true, so every
flag is written out here. The models "in flight" there (a swap begun, the
process not yet starting) are running here: llama-swap counts them
(internal/router/scheduler/fifo.go, runningSet).
"""

from collections.abc import Mapping

import pytest
from hypothesis import given
from hypothesis import strategies as st

from queueapp.policy.routing import (
    DEFAULT_GROUP,
    GroupRouting,
    RoutingConfigError,
    UnknownModel,
    evictions,
    resolve,
    routing_from_config,
)

GO = "llama-swap internal/router/group_test.go"


def group(*members: str, swap: bool, exclusive: bool, persistent: bool = False) -> dict:
    return {
        "swap": swap,
        "exclusive": exclusive,
        "persistent": persistent,
        "members": list(members),
    }


def with_groups(groups: Mapping[str, dict], *extra_models: str) -> dict:
    members = [m for each in groups.values() for m in each["members"]]
    models = {model: {"cmd": "serve"} for model in [*members, *extra_models]}
    return {
        "models": models,
        "routing": {"router": {"use": "group", "settings": {"groups": groups}}},
    }


# (origin, groups, running, requested, unloaded)
GROUP_CASES = [
    (
        f"{GO} TestGroup_ServeHTTP_SwapStopsPrevious",
        {"g": group("a", "b", swap=True, exclusive=True)},
        {"a"},
        "b",
        {"a"},
    ),
    (
        f"{GO} TestGroup_NonSwapGroup_NoStop",
        {"g": group("a", "b", swap=False, exclusive=False)},
        {"a"},
        "b",
        set(),
    ),
    (
        f"{GO} TestGroup_CrossGroupExclusive",
        {"g1": group("a", swap=True, exclusive=True), "g2": group("b", swap=True, exclusive=True)},
        {"a"},
        "b",
        {"a"},
    ),
    (
        f"{GO} TestGroup_CrossGroupNonExclusiveParallel (first request)",
        {
            "g1": group("a", swap=True, exclusive=False),
            "g2": group("b", swap=True, exclusive=False),
        },
        set(),
        "a",
        set(),
    ),
    (
        f"{GO} TestGroup_CrossGroupNonExclusiveParallel (second, a in flight)",
        {
            "g1": group("a", swap=True, exclusive=False),
            "g2": group("b", swap=True, exclusive=False),
        },
        {"a"},
        "b",
        set(),
    ),
    (
        f"{GO} TestGroup_SameGroupSwapSerialises (b while a is in flight)",
        {"g": group("a", "b", swap=True, exclusive=False)},
        {"a"},
        "b",
        {"a"},
    ),
    (
        f"{GO} TestGroup_PersistentNotEvicted",
        {
            "persist": group("a", swap=True, exclusive=False, persistent=True),
            "other": group("b", swap=True, exclusive=True),
        },
        {"a"},
        "b",
        set(),
    ),
    (
        f"{GO} TestGroup_NonExclusiveDoesNotUnloadExclusive",
        {"g1": group("a", swap=True, exclusive=True), "g2": group("b", swap=True, exclusive=False)},
        {"a"},
        "b",
        set(),
    ),
    (
        "the quirk's other half (llama-swap internal/router/group.go EvictionFor): "
        "a request for the running exclusive group's model unloads the non-exclusive one",
        {"g1": group("a", swap=True, exclusive=True), "g2": group("b", swap=True, exclusive=False)},
        {"a", "b"},
        "a",
        {"b"},
    ),
    (
        "a swapping group unloads a running sibling even when the requested model runs too",
        {"g": group("a", "b", swap=True, exclusive=False)},
        {"a", "b"},
        "a",
        {"b"},
    ),
    (
        "an exclusive group leaves a persistent group's models and unloads the rest",
        {
            "keep": group("p", swap=False, exclusive=False, persistent=True),
            "chat": group("c", swap=True, exclusive=False),
            "image": group("i", swap=True, exclusive=True),
        },
        {"p", "c"},
        "i",
        {"c"},
    ),
    (
        "a persistent group still swaps among its own members",
        {"keep": group("p", "q", swap=True, exclusive=False, persistent=True)},
        {"p"},
        "q",
        {"p"},
    ),
]


@pytest.mark.parametrize(
    ("groups", "running", "requested", "unloaded"),
    [pytest.param(*case[1:], id=case[0]) for case in GROUP_CASES],
)
def test_the_group_engine_unloads_what_llama_swap_unloads(groups, running, requested, unloaded):
    config = routing_from_config(with_groups(groups))
    assert evictions(config, frozenset(running), requested) == frozenset(unloaded)


def test_without_routing_every_model_is_in_one_exclusive_swapping_group():
    config = routing_from_config({"models": {"a": {}, "b": {}, "c": {}}})
    assert isinstance(config.engine, GroupRouting)
    default = config.engine.groups[DEFAULT_GROUP]
    assert (default.swap, default.exclusive, default.persistent) == (True, True, False)
    assert evictions(config, frozenset({"a", "b"}), "c") == {"a", "b"}
    assert evictions(config, frozenset({"a", "b"}), "a") == {"b"}
    assert evictions(config, frozenset({"a"}), "a") == frozenset()


def test_a_model_outside_every_group_unloads_all_but_persistent_groups():
    groups = {
        "keep": group("p", swap=False, exclusive=False, persistent=True),
        "pair": group("x", "y", swap=False, exclusive=False),
    }
    config = routing_from_config(with_groups(groups, "loner"))
    assert evictions(config, frozenset({"p", "x", "y"}), "loner") == {"x", "y"}
    # The non-exclusive pair loads beside the running loner (the kept quirk).
    assert evictions(config, frozenset({"loner"}), "x") == frozenset()


def test_a_group_written_without_flags_swaps_and_is_exclusive_as_in_yaml():
    config = routing_from_config(
        {
            "models": {"a": {}, "b": {}, "c": {}},
            "routing": {"router": {"settings": {"groups": {"g": {"members": ["a", "b"]}}}}},
        }
    )
    assert evictions(config, frozenset({"a", "c"}), "b") == {"a", "c"}


def test_the_legacy_top_level_groups_are_read():
    config = routing_from_config(
        {
            "models": {"a": {}, "b": {}},
            "groups": {"both": {"swap": False, "exclusive": False, "members": ["a", "b"]}},
        }
    )
    assert evictions(config, frozenset({"a"}), "b") == frozenset()


def test_groups_are_read_when_the_unused_matrix_beside_them_would_not_compile():
    # load.go reads only the engine `use` names; the other settings are ignored.
    settings = {"groups": {"g": group("a", swap=False, exclusive=False)}, "matrix": {"sets": {}}}
    config = routing_from_config(
        {"models": {"a": {}}, "routing": {"router": {"use": "group", "settings": settings}}}
    )
    assert isinstance(config.engine, GroupRouting)


def test_an_alias_resolves_to_its_model_in_requests_and_running_names():
    config = routing_from_config(
        {
            "models": {
                "llama-8b": {"aliases": ["llama"], "concurrencyLimit": 4},
                "qwen": {"filters": {"setParamsByID": {"qwen-fast": {"temperature": 0.1}}}},
            }
        }
    )
    assert resolve(config, "llama") == "llama-8b"
    assert resolve(config, "llama-8b") == "llama-8b"
    assert resolve(config, "qwen-fast") == "qwen"
    assert evictions(config, frozenset({"llama"}), "qwen-fast") == {"llama-8b"}
    assert config.models["llama-8b"].concurrency_limit == 4
    assert config.models["qwen"].concurrency_limit is None


def test_an_unknown_model_name_is_refused():
    config = routing_from_config({"models": {"a": {}}})
    with pytest.raises(UnknownModel):
        resolve(config, "b")
    with pytest.raises(UnknownModel):
        evictions(config, frozenset(), "b")


# (why, config, key at fault, words of the reason)
CONFIG_ERRORS = [
    (
        f"a model in two groups ({GO} TestGroup_NewGroup_DuplicateMembership)",
        with_groups(
            {
                "g1": group("a", swap=True, exclusive=False),
                "g2": group("a", swap=True, exclusive=False),
            }
        ),
        "routing.router.settings.groups.g2.members",
        "also in group 'g1'",
    ),
    (
        "an unknown model in a group",
        {"models": {"a": {}}, "groups": {"g": {"members": ["a", "ghost"]}}},
        "groups.g.members",
        "unknown model id 'ghost'",
    ),
    (
        "an alias in a group (llama-swap would run its model twice)",
        {"models": {"a": {"aliases": ["al"]}}, "groups": {"g": {"members": ["al"]}}},
        "groups.g.members",
        "unknown model id 'al'",
    ),
    (
        "a model twice in one group (llama-swap internal/config/load.go)",
        {"models": {"a": {}}, "groups": {"g": {"members": ["a", "a"]}}},
        "groups.g.members",
        "listed twice",
    ),
    (
        "legacy groups mixed with routing (llama-swap internal/config/load.go)",
        {
            "models": {"a": {}},
            "groups": {"g": {"members": ["a"]}},
            "routing": {"router": {"use": "group"}},
        },
        "routing.router",
        "legacy top-level",
    ),
    (
        "a legacy matrix mixed with routing groups",
        {
            "models": {"a": {}},
            "matrix": {"sets": {"s": "a"}},
            "routing": {"router": {"settings": {"groups": {"g": {"members": ["a"]}}}}},
        },
        "routing.router",
        "legacy top-level",
    ),
    (
        "legacy groups and a legacy matrix together",
        {"models": {"a": {}}, "groups": {"g": {"members": ["a"]}}, "matrix": {"sets": {"s": "a"}}},
        "groups",
        "together with 'matrix'",
    ),
    (
        "an unknown engine",
        {"models": {"a": {}}, "routing": {"router": {"use": "lru"}}},
        "routing.router.use",
        "unknown router 'lru'",
    ),
    (
        "the matrix engine without a matrix",
        {"models": {"a": {}}, "routing": {"router": {"use": "matrix"}}},
        "routing.router.settings.matrix",
        "use is 'matrix'",
    ),
    (
        "one alias on two models",
        {"models": {"a": {"aliases": ["x"]}, "b": {"aliases": ["x"]}}},
        "models.b.aliases",
        "already used by model 'a'",
    ),
    (
        "a setParamsByID key that is another model's id",
        {"models": {"a": {"filters": {"setParamsByID": {"b": {}}}}, "b": {}}},
        "models.a.filters",
        "conflicts with an existing model ID",
    ),
    (
        "a group flag that is not a boolean",
        {"models": {"a": {}}, "groups": {"g": {"swap": "yes", "members": ["a"]}}},
        "groups.g.swap",
        "true or false",
    ),
    (
        "a group named as llama-swap's own default group",
        {"models": {"a": {}}, "groups": {DEFAULT_GROUP: {"members": ["a"]}}},
        f"groups.{DEFAULT_GROUP}",
        "ungrouped models",
    ),
]


@pytest.mark.parametrize(
    ("config", "key", "reason"), [pytest.param(*case[1:], id=case[0]) for case in CONFIG_ERRORS]
)
def test_a_config_llama_swap_refuses_is_refused_naming_key_and_reason(config, key, reason):
    with pytest.raises(RoutingConfigError) as refused:
        routing_from_config(config)
    assert refused.value.key == key
    assert reason in refused.value.reason
    assert str(refused.value).startswith(f"{key}: ")
    assert "\n" not in str(refused.value)


MODELS = ["a", "b", "c", "d", "e"]


@st.composite
def group_configs(draw) -> dict:
    grouped = draw(st.lists(st.sampled_from(MODELS), unique=True))
    cuts = draw(st.lists(st.integers(0, len(grouped)), max_size=3))
    bounds = sorted({0, len(grouped), *cuts})
    groups = {
        f"g{i}": group(
            *grouped[start:end],
            swap=draw(st.booleans()),
            exclusive=draw(st.booleans()),
            persistent=draw(st.booleans()),
        )
        for i, (start, end) in enumerate(zip(bounds, bounds[1:], strict=False))
    }
    return with_groups(groups, *[m for m in MODELS if m not in grouped])


@given(
    config=group_configs(),
    running=st.frozensets(st.sampled_from(MODELS)),
    requested=st.sampled_from(MODELS),
)
def test_the_group_engine_unloads_only_running_models_never_the_requested_one(
    config, running, requested
):
    unloaded = evictions(routing_from_config(config), running, requested)
    assert unloaded <= running - {requested}
