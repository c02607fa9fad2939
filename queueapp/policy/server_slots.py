"""How many requests a model's server answers at once: its slots, as its
llama-swap config says before it runs, and where a model's `parallel`
comes from.

A batching server answers several requests at once: llama-server with
`-np N` / `--parallel N` (or `LLAMA_ARG_N_PARALLEL` in its environment),
vLLM with `--max-num-seqs N`. Sending it one request at a time leaves its
slots idle; sending more than it has only queues them inside it, where
gpusched's order no longer holds. So a model's `parallel` is, first to
last (`ParallelSource`):

- `operator`: what the operator set; it always wins;
- `server`: what the running server reports (llama-server's `GET /props`
  `total_slots`, through llama-swap's `/upstream/{model}/props`), read when
  the model becomes ready;
- `config`: the flag in the model's `cmd` (after llama-swap's macros are
  expanded) or `env`, read with the config;
- `default`: 1, one request at a time (a server that says nothing may be
  one that answers one at a time).

Every value is bounded by the model's `concurrencyLimit`, the requests
llama-swap itself lets through at once (queueapp/policy/concurrency.py).
A flag of 0 or below (llama-server's `-1`, "auto") says nothing here: the
server's own count follows once it runs.

Several GPUs may run a model, each from its own config: the lowest value
among them binds, since a job may run on any of them.
"""

from __future__ import annotations

import enum
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from queueapp.policy.config_macros import expand_macros, model_macros
from queueapp.policy.occupancy import MAX_PARALLEL

DEFAULT_PARALLEL = 1

# The flags that set a server's slots, by the servers llama-swap runs
# (llama.cpp's common/arg.cpp `--parallel`; vLLM's engine args).
SLOT_FLAGS = ("-np", "--parallel", "--max-num-seqs", "--max_num_seqs")
# llama.cpp reads each flag from an LLAMA_ARG_ variable too; the command line wins.
SLOT_ENV_VARIABLE = "LLAMA_ARG_N_PARALLEL"


class ParallelSource(enum.StrEnum):
    """Where a model's `parallel` came from, strongest first."""

    OPERATOR = "operator"
    SERVER = "server"
    CONFIG = "config"
    DEFAULT = "default"


@dataclass(frozen=True)
class Slots:
    """A model's slots on one GPU, and who said so (`server` or `config`)."""

    slots: int
    source: ParallelSource


def command_words(command: str) -> list[str]:
    """The words of a config's `cmd` as llama-swap runs it: comment lines
    dropped, line continuations joined, then split as a shell would."""
    lines = [line for line in command.splitlines() if not line.strip().startswith("#")]
    joined = " ".join(line.rstrip().removesuffix("\\") for line in lines)
    try:
        return shlex.split(joined)
    except ValueError:  # an unclosed quote: llama-swap would fail to start it
        return joined.split()


def slots_from_command(words: Iterable[str]) -> int | None:
    """The slots a server's command line sets (the last flag wins, as in an
    argument parser); None when it sets none, or "auto" (0 or below)."""
    found: str | None = None
    words = list(words)
    for index, word in enumerate(words):
        flag, equals, value = word.partition("=")
        if flag not in SLOT_FLAGS:
            continue
        if equals:
            found = value
        elif index + 1 < len(words):
            found = words[index + 1]
    return _positive(found)


def slots_from_env(env: Iterable[object]) -> int | None:
    """The slots `LLAMA_ARG_N_PARALLEL` sets in a model's `env` list
    (`NAME=value` strings); None without it."""
    found: str | None = None
    for entry in env:
        name, equals, value = str(entry).partition("=")
        if equals and name.strip() == SLOT_ENV_VARIABLE:
            found = value.strip()
    return _positive(found)


def _positive(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        number = int(text)
    except ValueError:
        return None
    return number if number > 0 else None


def config_slots(config: Mapping) -> dict[str, int]:
    """Each model's slots as a llama-swap config (its YAML loaded) sets them
    in `cmd` or `env`, by model id; models that set none are left out."""
    models = config.get("models")
    if not isinstance(models, Mapping):
        return {}
    found: dict[str, int] = {}
    for model_id, entry in models.items():
        if not isinstance(entry, Mapping):
            continue
        macros = model_macros(config, entry)
        command = entry.get("cmd")
        slots = None
        if isinstance(command, str):
            expanded = expand_macros(command, macros, model_id=str(model_id))
            slots = slots_from_command(command_words(expanded))
        env = entry.get("env")
        if slots is None and isinstance(env, list):
            slots = slots_from_env(
                expand_macros(str(item), macros, model_id=str(model_id)) for item in env
            )
        if slots is not None:
            found[str(model_id)] = slots
    return found


def slots_from_props(answer: object) -> int | None:
    """`total_slots` of llama-server's `GET /props` answer; None when the
    answer is not that (another server, an error page)."""
    if not isinstance(answer, Mapping):
        return None
    total = answer.get("total_slots")
    if isinstance(total, bool) or not isinstance(total, int) or total < 1:
        return None
    return total


# --- One GPU's slots, as its row keeps them (`Gpu.model_slots`) ------------
# By model id: {"config": N, "server": M}, either key absent when unknown.


def gpu_slots(stored: object) -> dict[str, Slots]:
    """The slots of each model a GPU's row holds: its server's count, else
    its config's; models with neither are left out."""
    found: dict[str, Slots] = {}
    if not isinstance(stored, Mapping):
        return found
    for model, entry in stored.items():
        if not isinstance(entry, Mapping):
            continue
        for source in (ParallelSource.SERVER, ParallelSource.CONFIG):
            count = entry.get(source.value)
            if isinstance(count, int) and not isinstance(count, bool) and count > 0:
                found[str(model)] = Slots(count, source)
                break
    return found


def with_config_slots(stored: object, config: Mapping[str, int]) -> dict[str, dict[str, int]]:
    """A GPU's stored slots after its config was read, setting `config`
    (model id → slots): each model's config count replaced, and its
    server's count dropped where the config's changed (llama-swap restarts
    such a model; it is read again when ready). A model whose config never
    set a count keeps its server's."""
    kept = {
        str(model): dict(entry)
        for model, entry in (stored.items() if isinstance(stored, Mapping) else ())
        if isinstance(entry, Mapping)
    }
    for model in set(kept) | set(config):
        entry = kept.setdefault(model, {})
        before = entry.pop(ParallelSource.CONFIG.value, None)
        if model in config:
            entry[ParallelSource.CONFIG.value] = config[model]
        if before != config.get(model):
            entry.pop(ParallelSource.SERVER.value, None)
        if not entry:
            del kept[model]
    return kept


def with_server_slots(stored: object, model: str, slots: int) -> dict[str, dict[str, int]]:
    """A GPU's stored slots after `model`'s server reported `slots`."""
    kept = {
        str(name): dict(entry)
        for name, entry in (stored.items() if isinstance(stored, Mapping) else ())
        if isinstance(entry, Mapping)
    }
    kept.setdefault(model, {})[ParallelSource.SERVER.value] = slots
    return kept


@dataclass(frozen=True)
class Parallel:
    """A model's `parallel` and where it came from."""

    value: int
    source: ParallelSource


def model_parallel(
    *,
    operator: int | None,
    per_gpu: Iterable[Slots],
    limit: int | None,
) -> Parallel:
    """A model's `parallel`: the operator's value, else the lowest the GPUs
    report (a server's count before a config's on a tie), else 1; bounded
    by `limit` (its lowest concurrencyLimit; None: none known) and by
    MAX_PARALLEL, the most gpusched gives one GPU."""
    if operator is not None:
        chosen = Parallel(operator, ParallelSource.OPERATOR)
    else:
        reported = sorted(per_gpu, key=lambda each: (each.slots, _STRENGTH[each.source]))
        chosen = (
            Parallel(reported[0].slots, reported[0].source)
            if reported
            else Parallel(DEFAULT_PARALLEL, ParallelSource.DEFAULT)
        )
    bound = min(MAX_PARALLEL, limit) if limit is not None else MAX_PARALLEL
    if chosen.value > bound:
        return Parallel(bound, chosen.source)
    return chosen


_STRENGTH = {source: rank for rank, source in enumerate(ParallelSource)}
