"""Trying several policy settings on one trace: `simulate TRACE --sweep NAME=V1,V2 ...`
(with `--gpus N`, on N GPUs)."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import fields, replace

from queueapp.policy import PolicyInvariantError, PolicySettings, check_invariant
from queueapp.simulation.baselines import Gpusched
from queueapp.simulation.cluster_policies import compare_on_gpus
from queueapp.simulation.engine import simulate
from queueapp.simulation.metrics import Summary, summarize
from queueapp.simulation.traces import Trace

SWEEPABLE = tuple(f.name for f in fields(PolicySettings))
EXAMPLE = "aging_divisor=30,60,120 swap_affinity_bonus=0,5,10"


class SweepError(ValueError):
    """A --sweep argument that cannot be read or settings the policy refuses."""


def parse_sweep(arguments: Sequence[str]) -> dict[str, list[float]]:
    """`["aging_divisor=30,60", "swap_affinity_bonus=0,5"]` -> {name: values}, in order."""
    grid: dict[str, list[float]] = {}
    for argument in arguments:
        name, sep, raw = argument.partition("=")
        name = name.strip()
        if not sep or not name or not raw.strip():
            raise SweepError(
                f"bad sweep argument {argument!r}: expected NAME=V1,V2,... e.g. {EXAMPLE}"
            )
        if name not in SWEEPABLE:
            raise SweepError(
                f"unknown setting {name!r} in --sweep; choose from {', '.join(SWEEPABLE)}"
            )
        if name in grid:
            raise SweepError(f"{name} is given twice in --sweep; list all its values once")
        values = []
        for text in raw.split(","):
            try:
                value = float(text)
            except ValueError:
                raise SweepError(f"{name}: {text.strip()!r} is not a number") from None
            if name == "band_spacing" and value != int(value):
                raise SweepError(f"band_spacing: {text.strip()!r} is not a whole number")
            values.append(int(value) if name == "band_spacing" else value)
        grid[name] = values
    if not grid:
        raise SweepError(f"--sweep needs at least one NAME=V1,V2,... e.g. {EXAMPLE}")
    return grid


def sweep_settings(
    grid: dict[str, list[float]], *, base: PolicySettings | None = None
) -> list[PolicySettings]:
    """Every combination, the first setting varying slowest."""
    base = base or PolicySettings()
    names = list(grid)
    return [
        replace(base, **dict(zip(names, combination, strict=True)))  # type: ignore[arg-type]  # names are PolicySettings fields
        for combination in itertools.product(*(grid[name] for name in names))
    ]


def run_sweep(
    trace: Trace,
    settings: Sequence[PolicySettings],
    *,
    gpus: int = 1,
    parallel: Mapping[str, int] | None = None,
) -> list[tuple[PolicySettings, Summary]]:
    """gpusched on `trace` with each settings, on `gpus` GPUs (with `parallel`'s
    slots); refuses settings the admin would refuse."""
    for candidate in settings:
        try:
            check_invariant(candidate, trace.tier_bonuses())
        except PolicyInvariantError as exc:
            raise SweepError(f"settings {_describe(candidate)} are refused: {exc}") from None
    # Shorter first reads each job's size-aware estimate, which only the
    # replay on several GPUs learns (one GPU there is this replay's twin).
    if gpus > 1 or parallel or any(s.shortest_first_weight > 0 for s in settings):
        return [
            (
                candidate,
                summarize(
                    compare_on_gpus(trace, gpus, ["gpusched"], candidate, parallel=parallel)[0]
                ),
            )
            for candidate in settings
        ]
    return [(candidate, summarize(simulate(trace, Gpusched(candidate)))) for candidate in settings]


def _describe(settings: PolicySettings) -> str:
    return ", ".join(f"{name}={getattr(settings, name):g}" for name in SWEEPABLE)
