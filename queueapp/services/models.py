"""The operator's per-model settings: how many jobs of a model share a GPU."""

from __future__ import annotations

from django.db import transaction

from queueapp.dispatch.wakeup import work_available
from queueapp.errors import InvalidInput, NotFound
from queueapp.live.events import queue_changed
from queueapp.models import Gpu, ModelSetting
from queueapp.policy import MAX_PARALLEL
from queueapp.selectors import gpus_list


@transaction.atomic  # not durable: the admin's form view holds a transaction
def model_parallel_set(*, name: str, parallel: int) -> ModelSetting:
    """Let a GPU with model `name` loaded run up to `parallel` of its jobs at
    once (1: one at a time). Applies from the next claim: a raised value
    fills the new slots at once; a lowered one gives no slot until the jobs
    in flight are fewer.

    The model must be one a job can be submitted for: with every GPU's list
    of models known, one of them runs it (or it has a setting already)."""
    if isinstance(parallel, bool) or not isinstance(parallel, int):
        raise InvalidInput("must be a whole number", field="parallel")
    if not 1 <= parallel <= MAX_PARALLEL:
        raise InvalidInput(f"must be from 1 to {MAX_PARALLEL}", field="parallel")
    setting = ModelSetting.objects.select_for_update().filter(name=name).first()
    if setting is None:
        model_served_check(name)
        setting = ModelSetting(name=name)
    setting.parallel = parallel
    setting.save()
    queue_changed(kind="models")
    work_available()  # new slots may be free now
    return setting


def model_served_check(name: str) -> None:
    """Raise NotFound, naming the models served, when every GPU's list of
    models is known and none runs `name` (a single GPU runs any model), as
    a submission for it is refused."""
    served = Gpu.models_served([gpu for gpu in gpus_list() if gpu.enabled])
    if served is not None and name not in served:
        listed = ", ".join(sorted(served)) or "none"
        raise NotFound(f"no GPU serves model {name!r}; served: {listed}")
