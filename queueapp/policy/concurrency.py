"""How many requests of one model llama-swap admits at once: its
`concurrencyLimit`, and a model's `parallel` held to it.

llama-swap answers a model's request beyond its `concurrencyLimit` with a
429 (internal/router/scheduler/fifo.go; unset: `defaultConcurrencyLimit`,
10). A `parallel` above the limit would send requests llama-swap refuses,
so the operator may not set one, and a config reloaded below a setting is
reported. Several GPUs may serve a model: the lowest limit of those whose
config lists it binds, since a job may run on any of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from queueapp.policy.routing import RoutingConfig, UnknownModel, resolve

# fifo.go defaultConcurrencyLimit: a model's requests admitted at once when unset.
DEFAULT_CONCURRENCY_LIMIT = 10


def concurrency_limit(config: RoutingConfig, model: str) -> int | None:
    """`model`'s concurrencyLimit in `config` (by id or alias; unset: the
    default); None when the config does not list it."""
    try:
        model_id = resolve(config, model)
    except UnknownModel:
        return None
    return config.models[model_id].concurrency_limit or DEFAULT_CONCURRENCY_LIMIT


@dataclass(frozen=True)
class ConcurrencyCap:
    """The lowest concurrencyLimit of a model, and the GPU whose config sets it."""

    gpu: str
    model: str
    limit: int


def lowest_concurrency_limit(
    configs: Mapping[str, RoutingConfig], model: str
) -> ConcurrencyCap | None:
    """The lowest concurrencyLimit of `model` across `configs` (by GPU name);
    None when none lists it. Ties go to the first GPU by name, so the
    answer, and the message built from it, is the same every time."""
    found: ConcurrencyCap | None = None
    for gpu in sorted(configs):
        limit = concurrency_limit(configs[gpu], model)
        if limit is not None and (found is None or limit < found.limit):
            found = ConcurrencyCap(gpu=gpu, model=model, limit=limit)
    return found


@dataclass(frozen=True)
class ParallelOverLimit:
    """A model's `parallel` above its concurrencyLimit in one GPU's config."""

    gpu: str
    model: str
    parallel: int
    limit: int

    def __str__(self) -> str:
        return (
            f"{self.gpu}: parallel {self.parallel} of {self.model} is above its "
            f"concurrencyLimit {self.limit} in llama-swap's config; gpusched runs at most "
            f"{self.limit}"
        )


def parallels_over_limit(
    configs: Mapping[str, RoutingConfig], parallels: Mapping[str, int]
) -> list[ParallelOverLimit]:
    """Every (GPU, model) whose `parallel` is above the model's
    concurrencyLimit in that GPU's config, by GPU then model."""
    return [
        ParallelOverLimit(gpu=gpu, model=model, parallel=parallel, limit=limit)
        for gpu in sorted(configs)
        for model, parallel in sorted(parallels.items())
        if (limit := concurrency_limit(configs[gpu], model)) is not None and parallel > limit
    ]
