"""A llama-swap YAML config, as far as the simulator serves it (``--config PATH``).

Read: ``models:`` (ids, ``aliases``, ``concurrencyLimit``, ``ttl``, ``name``,
``description``, each ``filters.setParamsByID`` key as one more alias, macros expanded as
llama-swap expands them, and the slots ``cmd`` or ``env`` sets: ``-np N``, ``--parallel N``,
``--max-num-seqs N``, ``LLAMA_ARG_N_PARALLEL``) and the routing:
``routing.router.use`` (``group``, the default, or ``matrix``) with
``routing.router.settings.groups`` / ``.matrix``, or the legacy top-level ``groups:`` /
``matrix:``. The checks are llama-swap v250's (internal/config/load.go,
config.go, matrix.go): mixing the legacy keys with ``routing.router`` is an error, so is
an unknown router or scheduler, a duplicate alias, a model in two groups, an unknown
model in a set. Every other key is llama-swap's business and is ignored.

Simulator-only, in a place llama-swap keeps for free-form data: a model's
``metadata.simulator.seconds`` is its run time alone on the GPU (``--model NAME=SECONDS``
overrides it; ``--default-seconds`` stands in when neither is given), and
``metadata.simulator.size_scaled: true`` makes those seconds a reference request's, scaled
by each request's size (sizing.py; ``--size-scaled`` does it for every model).

Every error is a `ConfigError` whose text names the key at fault.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from queueapp.policy.config_macros import alias_names, set_params_names
from queueapp.policy.occupancy import MAX_PARALLEL
from queueapp.policy.server_slots import config_slots
from queueapp.upstream.simulator.routing import (
    Group,
    GroupRouter,
    MatrixRouter,
    Router,
    RoutingError,
)

# fifo.go defaultConcurrencyLimit: a model's requests admitted at once when unset.
DEFAULT_CONCURRENCY_LIMIT = 10
_VAR_KEY = re.compile(r"^[a-zA-Z0-9.-]{1,32}$")


class ConfigError(ValueError):
    """A config llama-swap (or the simulator) would refuse, with the key at fault."""


@dataclass(frozen=True)
class ModelEntry:
    aliases: tuple[str, ...] = ()
    concurrency_limit: int = DEFAULT_CONCURRENCY_LIMIT
    ttl: int = 0
    name: str = ""
    description: str = ""
    seconds: float | None = None  # metadata.simulator.seconds
    size_scaled: bool = False  # metadata.simulator.size_scaled
    # What its cmd or env sets (-np 4; queueapp/policy/server_slots.py): the
    # requests its server answers at once; None: unset.
    slots: int | None = None


@dataclass(frozen=True)
class SwapConfig:
    models: Mapping[str, ModelEntry]
    router: Router
    engine: str  # "group" or "matrix", as llama-swap's Routing.Router.Use ends up

    def real_model(self, requested: str) -> str | None:
        """The model id a request names, directly or through an alias."""
        if requested in self.models:
            return requested
        for model, entry in self.models.items():
            if requested in entry.aliases:
                return model
        return None


def _mapping(value: Any, key: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{key}: must be a mapping")
    return value


def _whole(value: Any, key: str, *, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"{key}: must be an integer >= {low}, got {value!r}")
    return value


def _flag(value: Any, key: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{key}: must be true or false, got {value!r}")
    return value


def _model(model_id: str, raw: Any, top: dict[str, Any], ids: Collection[str]) -> ModelEntry:
    key = f"models.{model_id}"
    spec = _mapping(raw, key)
    aliases = spec.get("aliases") or []
    if not isinstance(aliases, list) or not all(isinstance(a, str) and a for a in aliases):
        raise ConfigError(f"{key}.aliases: must be a list of names")
    aliases = alias_names(top, model_id, spec)
    # Each setParamsByID key is a name too (load.go), its macros expanded.
    _mapping(_mapping(spec.get("filters"), f"{key}.filters").get("setParamsByID"), key)
    for name in set_params_names(top, model_id, spec):
        if name != model_id and name in ids:
            raise ConfigError(
                f"{key}.filters.setParamsByID: key {name!r} conflicts with an existing model ID"
            )
        if name != model_id and name not in aliases:
            aliases.append(name)
    limit = spec.get("concurrencyLimit", 0)
    limit = _whole(limit, f"{key}.concurrencyLimit", low=0) or DEFAULT_CONCURRENCY_LIMIT
    ttl = _whole(spec.get("ttl", 0), f"{key}.ttl", low=0)
    seconds = _mapping(_mapping(spec.get("metadata"), f"{key}.metadata").get("simulator"), key)
    run = seconds.get("seconds")
    if run is not None and (isinstance(run, bool) or not isinstance(run, int | float) or run < 0):
        raise ConfigError(f"{key}.metadata.simulator.seconds: must be a number >= 0, got {run!r}")
    return ModelEntry(
        aliases=tuple(aliases),
        concurrency_limit=limit,
        ttl=ttl,
        name=str(spec.get("name") or ""),
        description=str(spec.get("description") or ""),
        seconds=None if run is None else float(run),
        size_scaled=_flag(
            seconds.get("size_scaled", False), f"{key}.metadata.simulator.size_scaled"
        ),
    )


def _groups(raw: dict[str, Any], key: str) -> dict[str, Group]:
    groups = {}
    for gid, spec in raw.items():
        at = f"{key}.{gid}"
        spec = _mapping(spec, at)
        members = spec.get("members") or []
        if not isinstance(members, list) or not all(isinstance(m, str) for m in members):
            raise ConfigError(f"{at}.members: must be a list of model ids")
        if len(set(members)) != len(members):
            raise ConfigError(f"{at}.members: duplicate model member")
        groups[str(gid)] = Group(
            members=tuple(members),
            swap=_flag(spec.get("swap", True), f"{at}.swap"),
            exclusive=_flag(spec.get("exclusive", True), f"{at}.exclusive"),
            persistent=_flag(spec.get("persistent", False), f"{at}.persistent"),
        )
    return groups


def _matrix(raw: dict[str, Any], key: str, models: list[str]) -> MatrixRouter:
    variables = _mapping(raw.get("vars"), f"{key}.vars")
    for var, model in variables.items():
        if not isinstance(var, str) or not _VAR_KEY.match(var) or not isinstance(model, str):
            raise ConfigError(f"{key}.vars.{var}: must be a 1-32 character key naming a model")
    sets = _mapping(raw.get("sets"), f"{key}.sets")
    if not all(isinstance(dsl, str) for dsl in sets.values()):
        raise ConfigError(f"{key}.sets: every set must be a DSL string")
    try:
        return MatrixRouter.build(
            [(str(name), dsl) for name, dsl in sets.items()],
            vars=variables,
            evict_costs=_mapping(raw.get("evict_costs"), f"{key}.evict_costs"),
            models=models,
        )
    except RoutingError as exc:
        raise ConfigError(f"{key}.{exc}") from None


def parse_config(document: Any) -> SwapConfig:
    """The simulator's view of a parsed llama-swap YAML document."""
    top = _mapping(document, "config")
    raw_models = _mapping(top.get("models"), "models")
    if not raw_models:
        raise ConfigError("models: the config serves no model")
    slots = config_slots(top)
    models = {
        str(mid): replace(
            _model(str(mid), spec, top, ids=[str(each) for each in raw_models]),
            slots=slots.get(str(mid)),
        )
        for mid, spec in raw_models.items()
    }
    seen: dict[str, str] = {}
    for mid, entry in models.items():
        for alias in entry.aliases:
            if alias in seen:
                raise ConfigError(f"models.{mid}.aliases: duplicate alias {alias} found")
            seen[alias] = mid

    routing = _mapping(top.get("routing"), "routing")
    router = _mapping(routing.get("router"), "routing.router")
    settings = _mapping(router.get("settings"), "routing.router.settings")
    use = router.get("use") or ""
    legacy = top.get("matrix") is not None or bool(top.get("groups"))
    if legacy and (use or settings.get("matrix") is not None or settings.get("groups")):
        raise ConfigError(
            "routing.router: the legacy top-level 'matrix'/'groups' keys and the "
            "'routing.router' block cannot both be used"
        )
    if legacy:
        matrix_at, groups_at, source = "matrix", "groups", top
    else:
        matrix_at, groups_at = "routing.router.settings.matrix", "routing.router.settings.groups"
        source = settings
        if use not in ("", "group", "matrix"):
            raise ConfigError(f"routing.router.use: unknown router {use!r} (valid: group, matrix)")
        if use == "matrix" and settings.get("matrix") is None:
            raise ConfigError("routing.router.use is 'matrix' but its settings.matrix is not set")
    raw_matrix = source.get("matrix") if legacy or use == "matrix" else None
    raw_groups = _mapping(source.get("groups"), groups_at) if raw_matrix is None else {}
    if legacy and raw_matrix is not None and top.get("groups"):
        raise ConfigError("groups: config cannot use both 'groups' and 'matrix'")
    scheduler = _mapping(routing.get("scheduler"), "routing.scheduler").get("use") or "fifo"
    if scheduler != "fifo":
        raise ConfigError(f"routing.scheduler.use: unknown scheduler {scheduler!r} (valid: fifo)")

    ids = list(models)
    if raw_matrix is not None:
        return SwapConfig(
            models=models,
            router=_matrix(_mapping(raw_matrix, matrix_at), matrix_at, ids),
            engine="matrix",
        )
    try:
        group_router = GroupRouter.build(_groups(raw_groups, groups_at), ids)
    except RoutingError as exc:
        raise ConfigError(f"{groups_at}.{exc}") from None
    return SwapConfig(models=models, router=group_router, engine="group")


def load_config(path: str | Path) -> SwapConfig:
    """Read and check the llama-swap config at ``path``."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"--config: cannot read {path}: {exc.strerror}") from None
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"--config: {path} is not valid YAML: {exc}") from None
    return parse_config(document)


def served_seconds(
    config: SwapConfig, overrides: Mapping[str, float], *, default_seconds: float
) -> dict[str, float]:
    """Each model's run time alone: ``--model`` first, then ``metadata.simulator.seconds``,
    then ``--default-seconds``."""
    for name in overrides:
        if name not in config.models:
            raise ConfigError(f"--model {name}: the config has no such model")
    return {
        name: overrides.get(name, default_seconds if entry.seconds is None else entry.seconds)
        for name, entry in config.models.items()
    }


def config_ttls(config: SwapConfig) -> dict[str, int]:
    return {name: entry.ttl for name, entry in config.models.items() if entry.ttl}


def config_size_scaled(config: SwapConfig) -> frozenset[str]:
    """The models whose run time follows the request's size (sizing.py)."""
    return frozenset(name for name, entry in config.models.items() if entry.size_scaled)


def config_parallel(config: SwapConfig) -> dict[str, int]:
    """The models whose server answers several requests at once, as their
    ``cmd`` or ``env`` says (``-np 4``): the simulator's ``--model-parallel``
    for them, unless given (at most MAX_PARALLEL, the simulator's bound)."""
    return {
        name: min(entry.slots, MAX_PARALLEL) for name, entry in config.models.items() if entry.slots
    }
