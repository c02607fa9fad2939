"""Which models llama-swap unloads to serve a request: its routing, predicted.

llama-swap (v250) keeps a set of running models; "running" is every process
not stopped, starting and stopping ones included, plus the targets of swaps
it has begun (internal/router/scheduler/fifo.go, `runningSet`). Before it
serves a model it asks its engine which of them to stop
(internal/router/scheduler/scheduler.go, `Swapper.EvictionFor`). It asks
even when the model already runs, and serves at once only if the answer is
nobody. `routing.router.use` picks the engine (internal/config/load.go):

- **group** (the default; internal/router/group.go, `EvictionFor`). Each
  group has `swap`, `exclusive` and `persistent` (defaults true, true,
  false: internal/config/config.go). A model in no group is in the
  "(default)" group, swap and exclusive. A running sibling in the requested
  model's group is stopped when that group swaps; a member of another group
  only when the requested group is exclusive and the other is not
  persistent. So a non-exclusive group's model leaves a running exclusive
  group alone, and the next request for the exclusive group's model stops
  it: a quirk llama-swap keeps on purpose from its old ProcessGroup.
- **matrix** (internal/router/matrix.go, internal/matrix/program.go
  `Solve`). Named sets are expressions (queueapp/policy/matrix_dsl.py) of
  models allowed to run together; any subset of a combination may. A model
  already running stops nobody. A model in no set runs alone. Otherwise each
  combination containing it costs the sum of `evict_costs` (default 1) of
  the running models outside it; the cheapest wins, ties going to the first
  in program order (a `+ref`'d set before the set naming it, then YAML
  order), and the running models outside it are stopped.

The legacy top-level `groups:` and `matrix:` keys are read as before; mixed
with `routing.router` they are a load error, as in llama-swap. This module
reads the YAML already loaded as dicts; it never reads the file.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from queueapp.policy.config_macros import alias_names, set_params_names
from queueapp.policy.matrix_dsl import (
    Expression,
    ExpressionSyntaxError,
    Leaf,
    SetRef,
    combinations,
    identifiers,
    map_leaves,
    parse_expression,
)

# The group llama-swap puts every model of no group in (internal/config/config.go).
DEFAULT_GROUP = "(default)"
DEFAULT_EVICT_COST = 1
# internal/config/matrix.go, varKeyPattern.
_VAR_NAME = re.compile(r"[a-zA-Z0-9.-]{1,32}")

# A var or model id to the model it names; None when it names none.
_ModelOf = Callable[[str], "str | None"]


class Engine(enum.Enum):
    """`routing.router.use`: how llama-swap decides what to unload."""

    GROUP = "group"
    MATRIX = "matrix"


class RoutingConfigError(ValueError):
    """llama-swap would refuse this routing: the key at fault and why."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"{key}: {reason}")
        self.key = key
        self.reason = reason


class UnknownModel(LookupError):
    """A name that is neither a model id nor an alias (llama-swap answers 404)."""


@dataclass(frozen=True)
class Model:
    model_id: str
    aliases: tuple[str, ...]
    # None: not set, llama-swap's own default applies (fifo.go: 10).
    concurrency_limit: int | None


@dataclass(frozen=True)
class Group:
    name: str
    swap: bool
    exclusive: bool
    persistent: bool
    members: tuple[str, ...]


@dataclass(frozen=True)
class GroupRouting:
    groups: Mapping[str, Group]
    group_of: Mapping[str, str]


@dataclass(frozen=True)
class MatrixSet:
    name: str
    text: str
    expression: Expression  # leaves resolved to model ids


@dataclass(frozen=True)
class MatrixRouting:
    sets: tuple[MatrixSet, ...]  # program order: what ties are broken by
    evict_costs: Mapping[str, int]

    def evict_cost(self, model_id: str) -> int:
        return self.evict_costs.get(model_id, DEFAULT_EVICT_COST)


@dataclass(frozen=True)
class RoutingConfig:
    models: Mapping[str, Model]
    aliases: Mapping[str, str]
    engine: GroupRouting | MatrixRouting


def resolve(config: RoutingConfig, name: str) -> str:
    """The model id `name` is, or is an alias of (a model id wins over an alias)."""
    if name in config.models:
        return name
    if name in config.aliases:
        return config.aliases[name]
    raise UnknownModel(name)


def names_served(
    stored: Iterable[str], routing: RoutingConfig | None, *, before: RoutingConfig | None = None
) -> list[str]:
    """The names a GPU answers to, from those its llama-swap lists at
    `GET /v1/models` (model ids; aliases too with `includeAliasesInList`):
    each listed name, and every name `routing` gives a listed model (its
    aliases and setParamsByID keys), sorted. `before`: the routing `stored`
    was given them by, whose names are taken out first (a reloaded config
    may have dropped some)."""
    listed = set(stored)
    if before is not None:
        listed -= {alias for alias in before.aliases if alias not in before.models}
    if routing is not None:
        listed |= {alias for alias, model in routing.aliases.items() if model in listed}
    return sorted(listed)


def evictions(config: RoutingConfig, running: frozenset[str], requested: str) -> frozenset[str]:
    """The running models llama-swap stops before it serves `requested`.

    `running` holds every model llama-swap counts as running: ready, starting
    or stopping. Names may be aliases; the answer is model ids.
    """
    target = resolve(config, requested)
    live = frozenset(resolve(config, name) for name in running)
    if isinstance(config.engine, GroupRouting):
        return _group_evictions(config.engine, live, target)
    return _matrix_evictions(config.engine, live, target)


def _group_evictions(routing: GroupRouting, running: frozenset[str], target: str) -> frozenset[str]:
    target_group = routing.groups[routing.group_of[target]]
    return frozenset(
        model
        for model in running
        if model != target and _group_stops(target_group, routing.groups[routing.group_of[model]])
    )


def _group_stops(target_group: Group, other: Group) -> bool:
    if other.name == target_group.name:
        return target_group.swap
    # llama-swap's kept quirk: only an exclusive group reaches across groups.
    return target_group.exclusive and not other.persistent


def _matrix_evictions(
    routing: MatrixRouting, running: frozenset[str], target: str
) -> frozenset[str]:
    if target in running:
        return frozenset()
    relevant = running | {target}
    expression_of = {each.name: each.expression for each in routing.sets}
    best: tuple[int, frozenset[str]] | None = None
    for matrix_set in routing.sets:
        for combination in combinations(
            matrix_set.expression, relevant=relevant, expression_of=expression_of
        ):
            if target not in combination:
                continue
            cost = sum(routing.evict_cost(model) for model in running - combination)
            if best is None or cost < best[0]:
                best = (cost, combination)
    if best is None:
        return running  # in no set: it runs alone
    return running - best[1]


# --- Reading the config -----------------------------------------------------


def routing_from_config(config: Mapping) -> RoutingConfig:
    """The routing of a llama-swap config, as its YAML loads into dicts.

    Raises RoutingConfigError where llama-swap would refuse to start.
    """
    models = _models_from_config(config)
    aliases = _aliases(models)
    use, key, settings = _engine_settings(config)
    if use is Engine.MATRIX:
        order = config.get(SET_ORDER_KEY)
        engine: GroupRouting | MatrixRouting = _matrix_routing(
            settings, models, key=key, order=order if isinstance(order, list) else None
        )
    else:
        engine = _group_routing(settings, models, key=key)
    return RoutingConfig(models=models, aliases=aliases, engine=engine)


# The top-level sections `routing_from_config` reads besides `models`.
_ROUTING_SECTIONS = ("routing", "groups", "matrix")
# The matrix sets' YAML order, kept in the stored parts: PostgreSQL's jsonb
# keeps a mapping's keys in an order of its own, and the order of the sets
# breaks ties between them.
SET_ORDER_KEY = "x-gpusched-set-order"


def routing_parts(config: Mapping) -> dict[str, object]:
    """The parts of a llama-swap config that `routing_from_config` reads, as
    JSON: each model's aliases, concurrencyLimit and setParamsByID names,
    macros expanded (not its command or parameters), and the routing
    sections. Stored on
    the GPU's row, so a process that cannot read the file builds the same
    routing from it. Call it on a config `routing_from_config` accepted."""
    models: dict[str, object] = {}
    for model_id, raw in _mapping(config.get("models"), "models").items():
        entry = _mapping(raw, f"models.{model_id}")
        kept: dict[str, object] = {}
        if "aliases" in entry:
            kept["aliases"] = alias_names(config, str(model_id), entry)
        if "concurrencyLimit" in entry:
            kept["concurrencyLimit"] = entry["concurrencyLimit"]
        names = set_params_names(config, str(model_id), entry)
        if names:
            kept["filters"] = {"setParamsByID": {name: {} for name in names}}
        models[str(model_id)] = kept
    parts: dict[str, object] = {"models": models}
    parts.update({key: config[key] for key in _ROUTING_SECTIONS if key in config})
    use, key, settings = _engine_settings(config)
    if use is Engine.MATRIX:
        parts[SET_ORDER_KEY] = [str(name) for name in _mapping(settings, key).get("sets") or {}]
    return _as_json(parts)  # type: ignore[return-value]


def _as_json(value: object) -> object:
    """YAML's timestamps, sets and binary as text; a float JSON cannot hold too."""
    if isinstance(value, Mapping):
        return {str(key): _as_json(item) for key, item in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_as_json(item) for item in value]
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return value
    return str(value)


def _mapping(value: object, key: str) -> Mapping:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise RoutingConfigError(key, f"must be a mapping, got {type(value).__name__}")
    return value


def _models_from_config(config: Mapping) -> dict[str, Model]:
    raw_models = {
        str(key): value for key, value in _mapping(config.get("models"), "models").items()
    }
    models: dict[str, Model] = {}
    for model_id, raw in raw_models.items():
        entry = _mapping(raw, f"models.{model_id}")
        aliases = tuple(alias_names(config, model_id, entry))
        limit = entry.get("concurrencyLimit")
        models[model_id] = Model(
            model_id=model_id,
            aliases=aliases + _params_aliases(config, model_id, entry, aliases, raw_models),
            concurrency_limit=limit if isinstance(limit, int) and limit > 0 else None,
        )
    return models


def _params_aliases(
    config: Mapping,
    model_id: str,
    entry: Mapping,
    aliases: tuple[str, ...],
    model_ids: Mapping[str, object],
) -> tuple[str, ...]:
    """llama-swap also answers to each `filters.setParamsByID` key, macros
    expanded (`${MODEL_ID}:high`; load.go, macros.go)."""
    key = f"models.{model_id}.filters"
    # Either one not a mapping: llama-swap refuses the config.
    _mapping(_mapping(entry.get("filters"), key).get("setParamsByID"), key)
    names = set_params_names(config, model_id, entry)
    if len(set(names)) < len(names):
        raise RoutingConfigError(key, "two setParamsByID keys resolve to the same name")
    extra: list[str] = []
    for name in names:
        if name in model_ids and name != model_id:
            reason = f"setParamsByID key {name!r} conflicts with an existing model ID"
            raise RoutingConfigError(key, reason)
        if name != model_id and name not in aliases:
            extra.append(name)
    return tuple(extra)


def _aliases(models: Mapping[str, Model]) -> dict[str, str]:
    aliases: dict[str, str] = {}
    for model in models.values():
        for alias in model.aliases:
            if alias in aliases:
                reason = f"alias {alias!r} is already used by model {aliases[alias]!r}"
                raise RoutingConfigError(f"models.{model.model_id}.aliases", reason)
            aliases[alias] = model.model_id
    return aliases


def _engine_settings(config: Mapping) -> tuple[Engine, str, object]:
    """The engine, its settings' key path and its settings, as load.go picks them."""
    legacy_groups = _mapping(config.get("groups"), "groups")
    legacy_matrix = config.get("matrix")
    router = _mapping(_mapping(config.get("routing"), "routing").get("router"), "routing.router")
    settings = _mapping(router.get("settings"), "routing.router.settings")
    use = router.get("use") or ""
    uses_routing = bool(use) or settings.get("matrix") is not None or bool(settings.get("groups"))
    if legacy_groups or legacy_matrix is not None:
        if uses_routing:
            reason = "the legacy top-level 'matrix'/'groups' keys cannot be mixed with it"
            raise RoutingConfigError("routing.router", reason)
        if legacy_groups and legacy_matrix is not None:
            raise RoutingConfigError("groups", "cannot be used together with 'matrix'")
        if legacy_matrix is not None:
            return Engine.MATRIX, "matrix", legacy_matrix
        return Engine.GROUP, "groups", legacy_groups
    if use == Engine.MATRIX.value:
        if settings.get("matrix") is None:
            raise RoutingConfigError("routing.router.settings.matrix", "use is 'matrix' but unset")
        return Engine.MATRIX, "routing.router.settings.matrix", settings["matrix"]
    if use not in ("", Engine.GROUP.value):
        reason = f"unknown router {use!r} (valid: group, matrix)"
        raise RoutingConfigError("routing.router.use", reason)
    return Engine.GROUP, "routing.router.settings.groups", settings.get("groups")


def _group_routing(settings: object, models: Mapping[str, Model], *, key: str) -> GroupRouting:
    groups: dict[str, Group] = {}
    group_of: dict[str, str] = {}
    for name, raw in _mapping(settings, key).items():
        group = _group(str(name), _mapping(raw, f"{key}.{name}"), models, key=f"{key}.{name}")
        for member in group.members:
            if member in group_of:
                reason = f"model {member!r} is also in group {group_of[member]!r}"
                raise RoutingConfigError(f"{key}.{name}.members", reason)
            group_of[member] = group.name
        groups[group.name] = group
    ungrouped = tuple(sorted(model for model in models if model not in group_of))
    groups[DEFAULT_GROUP] = Group(
        DEFAULT_GROUP, swap=True, exclusive=True, persistent=False, members=ungrouped
    )
    group_of.update(dict.fromkeys(ungrouped, DEFAULT_GROUP))
    return GroupRouting(groups=groups, group_of=group_of)


def _group(name: str, raw: Mapping, models: Mapping[str, Model], *, key: str) -> Group:
    if name == DEFAULT_GROUP:
        raise RoutingConfigError(key, "the name is llama-swap's own group for ungrouped models")
    members = tuple(str(member) for member in raw.get("members") or ())
    for member in members:
        if member not in models:
            # llama-swap keys a group's processes by member: an alias would
            # run the model a second time, so only model ids are accepted.
            raise RoutingConfigError(f"{key}.members", f"unknown model id {member!r}")
    if len(set(members)) != len(members):
        raise RoutingConfigError(f"{key}.members", "a model is listed twice")
    return Group(
        name,
        swap=_flag(raw, "swap", default=True, key=key),
        exclusive=_flag(raw, "exclusive", default=True, key=key),
        persistent=_flag(raw, "persistent", default=False, key=key),
        members=members,
    )


def _flag(raw: Mapping, name: str, *, default: bool, key: str) -> bool:
    value = raw.get(name, default)
    if not isinstance(value, bool):
        raise RoutingConfigError(f"{key}.{name}", f"must be true or false, got {value!r}")
    return value


def _matrix_routing(
    settings: object, models: Mapping[str, Model], *, key: str, order: list | None = None
) -> MatrixRouting:
    """`order`: the sets' YAML order, when the mapping no longer has it
    (stored parts: SET_ORDER_KEY)."""
    raw = _mapping(settings, key)
    variables = _matrix_vars(_mapping(raw.get("vars"), f"{key}.vars"), models, key=f"{key}.vars")

    def model_of(name: str) -> str | None:
        # Vars first, then model ids; aliases are not read here (matrix.go).
        return variables.get(name) or (name if name in models else None)

    costs = _evict_costs(raw.get("evict_costs"), model_of, key=f"{key}.evict_costs")
    raw_sets = _mapping(raw.get("sets"), f"{key}.sets")
    if order:
        first = {name: raw_sets[name] for name in order if name in raw_sets}
        raw_sets = first | {name: text for name, text in raw_sets.items() if name not in first}
    sets = _matrix_sets(raw_sets, model_of, key=f"{key}.sets")
    return MatrixRouting(sets=sets, evict_costs=costs)


def _matrix_vars(raw: Mapping, models: Mapping[str, Model], *, key: str) -> dict[str, str]:
    for name, model in raw.items():
        if not _VAR_NAME.fullmatch(str(name)):
            reason = "must be 1-32 characters, alphanumeric, '-' or '.'"
            raise RoutingConfigError(f"{key}.{name}", reason)
        if model not in models:
            raise RoutingConfigError(f"{key}.{name}", f"unknown model id {model!r}")
    return {str(name): str(model) for name, model in raw.items()}


def _evict_costs(raw: object, model_of: _ModelOf, *, key: str) -> dict[str, int]:
    costs: dict[str, int] = {}
    for name, cost in _mapping(raw, key).items():
        model = model_of(str(name))
        if model is None:
            raise RoutingConfigError(f"{key}.{name}", "unknown var or model")
        if isinstance(cost, bool) or not isinstance(cost, int) or cost <= 0:
            raise RoutingConfigError(f"{key}.{name}", f"must be a positive integer, got {cost!r}")
        costs[model] = cost
    return costs


def _matrix_sets(raw: Mapping, model_of: _ModelOf, *, key: str) -> tuple[MatrixSet, ...]:
    if not raw:
        raise RoutingConfigError(key, "matrix must define at least one set")
    parsed = {
        str(name): _matrix_set(str(name), text, raw, model_of, key=f"{key}.{name}")
        for name, text in raw.items()
    }
    return tuple(parsed[name] for name in _program_order(parsed, key=key))


def _matrix_set(
    name: str, text: object, all_sets: Mapping, model_of: _ModelOf, *, key: str
) -> MatrixSet:
    if not isinstance(text, str):
        raise RoutingConfigError(key, f"must be an expression string, got {text!r}")
    try:
        expression = parse_expression(text)
    except ExpressionSyntaxError as error:
        raise RoutingConfigError(key, str(error)) from None
    for found in identifiers(expression):
        if isinstance(found, Leaf) and model_of(found.model) is None:
            raise RoutingConfigError(key, f"unknown var or model {found.model!r}")
        if isinstance(found, SetRef) and found.set_name not in all_sets:
            raise RoutingConfigError(key, f"references undefined set {found.set_name!r}")
    resolved = map_leaves(expression, lambda leaf: model_of(leaf) or leaf)
    return MatrixSet(name=name, text=text, expression=resolved)


def _program_order(sets: Mapping[str, MatrixSet], *, key: str) -> list[str]:
    """YAML order, each set after the sets it references (program.go)."""
    order: list[str] = []
    visiting: set[str] = set()

    def visit(name: str) -> None:
        if name in order:
            return
        if name in visiting:
            raise RoutingConfigError(f"{key}.{name}", "circular reference between sets")
        visiting.add(name)
        for found in identifiers(sets[name].expression):
            if isinstance(found, SetRef):
                visit(found.set_name)
        order.append(name)

    for name in sets:
        visit(name)
    return order
