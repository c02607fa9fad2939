"""The per-model settings: how many jobs of a model share a GPU (the
operator's value, else what its servers and configs say), what a
front-door caller's hang-up does to its running request, and what a run
typically takes before any is learned."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.db import transaction

from queueapp.dispatch.wakeup import work_available
from queueapp.errors import InvalidInput, NotFound
from queueapp.live.events import queue_changed
from queueapp.locks import lock_model_parallels
from queueapp.models import Gpu, ModelSetting, OnCallerGone
from queueapp.models.model_settings import MAX_TYPICAL_SECONDS
from queueapp.policy import MAX_PARALLEL
from queueapp.policy.concurrency import lowest_concurrency_limit
from queueapp.policy.server_slots import Slots, gpu_slots, model_parallel
from queueapp.selectors import gpus_list
from queueapp.services.expectations import model_expectations_refresh

MODEL_SETTINGS = ("parallel", "on_caller_gone", "typical_seconds")


@transaction.atomic  # not durable: the admin's form view holds a transaction
def model_setting_update(*, name: str, changes: Mapping[str, Any]) -> ModelSetting:
    """Change the settings of model `name` that `changes` names:

    - `parallel`: let a GPU with the model loaded run up to that many of its
      jobs at once (1: one at a time), whatever its servers say; None: as
      they say (`model_parallels_refresh`). Applies from the next claim: a
      raised value fills the new slots at once; a lowered one gives no slot
      until the jobs in flight are fewer. Never above the model's
      concurrencyLimit in a GPU's llama-swap config (`model_parallel_check`).
    - `on_caller_gone`: what becomes of a front-door request of the model
      when its caller hangs up while it runs (`OnCallerGone`); None or blank
      follows the path called (`OnCallerGone.by_path`). Applies to the next
      hang-up.
    - `typical_seconds`: what a run of the model takes, the estimate of
      jobs submitted before any of its runs is learned (None: unknown).

    The model must be one a job can be submitted for: with every GPU's list
    of models known, one of them runs it (or it has a setting already)."""
    unknown = sorted(set(changes) - set(MODEL_SETTINGS))
    if unknown:
        raise InvalidInput("unknown setting", field=unknown[0])
    if not changes:
        raise InvalidInput("give at least one", field=", ".join(MODEL_SETTINGS))
    parallel = changes.get("parallel")
    if parallel is not None:
        if isinstance(parallel, bool) or not isinstance(parallel, int):
            raise InvalidInput(
                "must be a whole number, or null: as its servers say", field="parallel"
            )
        if not 1 <= parallel <= MAX_PARALLEL:
            raise InvalidInput(f"must be from 1 to {MAX_PARALLEL}", field="parallel")
        model_parallel_check(name=name, parallel=parallel)
    on_caller_gone = changes.get("on_caller_gone") or ""
    if on_caller_gone not in ("", *OnCallerGone.values):
        raise InvalidInput(
            f"must be one of {', '.join(OnCallerGone.values)} (or null: by path), "
            f"not {on_caller_gone!r}",
            field="on_caller_gone",
        )
    typical = changes.get("typical_seconds")
    if typical is not None:
        typical_seconds_check(typical)
    if "parallel" in changes:
        lock_model_parallels()  # before the row: the refresh's order
    setting = ModelSetting.objects.select_for_update().filter(name=name).first()
    if setting is None:
        model_served_check(name)
        setting = ModelSetting(name=name)
    if "parallel" in changes:
        setting.operator_parallel = parallel
    if "on_caller_gone" in changes:
        setting.on_caller_gone = on_caller_gone
    if "typical_seconds" in changes:
        setting.typical_seconds = None if typical is None else float(typical)
    setting.save()
    if "typical_seconds" in changes:
        model_expectations_refresh(name)  # the estimate of its jobs that rest on it
    if "parallel" in changes:
        model_parallels_refresh()
        setting.refresh_from_db()
    return setting


@transaction.atomic
def model_parallels_refresh() -> bool:
    """Work out every model's `parallel` again from its sources
    (queueapp/policy/server_slots.py): the operator's value, else the lowest
    the enabled GPUs' servers or configs report (`Gpu.model_slots`), else 1;
    bounded by its lowest concurrencyLimit. Writes a row for each model a
    GPU reports slots for. Announces a change (new slots may be free);
    answers whether there was one."""
    lock_model_parallels()
    gpus = list(Gpu.objects.filter(enabled=True).order_by("name"))
    limits = Gpu.routing_configs(gpus)
    reported: dict[str, list[Slots]] = {}
    for gpu in gpus:
        for model, slots in gpu_slots(gpu.model_slots).items():
            reported.setdefault(model, []).append(slots)
    rows = {row.name: row for row in ModelSetting.objects.select_for_update()}
    changed = False
    for name in sorted(set(rows) | set(reported)):
        row = rows.get(name) or ModelSetting(name=name)
        cap = lowest_concurrency_limit(limits, name)
        worked = model_parallel(
            operator=row.operator_parallel,
            per_gpu=reported.get(name, ()),
            limit=cap.limit if cap else None,
        )
        if row.pk is not None and (row.parallel, row.parallel_source) == (
            worked.value,
            worked.source,
        ):
            continue
        row.parallel, row.parallel_source = worked.value, worked.source
        row.save()
        changed = True
    if changed:
        queue_changed(kind="models")
        work_available()  # new slots may be free now
    return changed


def typical_seconds_check(seconds: object) -> None:
    if isinstance(seconds, bool) or not isinstance(seconds, int | float):
        raise InvalidInput("must be a number of seconds, or null", field="typical_seconds")
    if not 0.01 <= seconds <= MAX_TYPICAL_SECONDS:
        raise InvalidInput(
            f"must be from 0.01 to {MAX_TYPICAL_SECONDS:g} seconds", field="typical_seconds"
        )


def model_parallel_set(*, name: str, parallel: int | None) -> ModelSetting:
    """`model_setting_update` of `parallel` alone (None: as its servers say)."""
    return model_setting_update(name=name, changes={"parallel": parallel})


def model_parallel_check(*, name: str, parallel: int) -> None:
    """Raise InvalidInput, naming the GPU, the model, its concurrencyLimit and
    `parallel`, when `parallel` is above the lowest concurrencyLimit of model
    `name` in the GPUs' llama-swap configs: llama-swap would answer the
    requests beyond it with a 429 (queueapp/policy/concurrency.py)."""
    cap = lowest_concurrency_limit(Gpu.routing_configs(gpus_list()), name)
    if cap is not None and parallel > cap.limit:
        raise InvalidInput(
            f"{parallel} is above the concurrencyLimit {cap.limit} of model {name!r} in "
            f"{cap.gpu}'s llama-swap config; llama-swap refuses the requests beyond it",
            field="parallel",
        )


def model_served_check(name: str) -> None:
    """Raise NotFound, naming the models served, when every GPU's list of
    models is known and none runs `name` (a single GPU runs any model), as
    a submission for it is refused."""
    served = Gpu.models_served([gpu for gpu in gpus_list() if gpu.enabled])
    if served is not None and name not in served:
        listed = ", ".join(sorted(served)) or "none"
        raise NotFound(f"no GPU serves model {name!r}; served: {listed}")
