"""GPUs: registering them, recording what their dispatcher sees, the
operator's changes.

A GPU's row is created by its dispatcher when it starts (and by `make run`
for every GPU it starts), from `LLAMA_SWAP_URL`; the dispatcher then keeps
its view of llama-swap current: reachable or not, the resident model, the
models listed at `GET /v1/models`. Writes only when something changed, each
with the dashboard's notice.

The web servers read a GPU's URL from its row, not from their own
environment: a front-door call granted on a GPU goes to that GPU's
llama-swap, and the web servers of a studio need no list of GPUs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.db.models.functions import Now

from gpusched.upstreams import Upstream, parse_upstreams
from queueapp.dispatch.wakeup import work_available
from queueapp.errors import InvalidInput, NotFound
from queueapp.live.events import queue_changed
from queueapp.locks import lock_model_parallels
from queueapp.models import Gpu
from queueapp.policy.resident_sets import routing_of_parts
from queueapp.policy.routing import UnknownModel, names_served, resolve
from queueapp.policy.server_slots import with_config_slots, with_server_slots
from queueapp.services.models import model_parallels_refresh
from queueapp.upstream.llama_swap_state import ModelsRunning

# What `PATCH /api/gpus/{name}/` may change: switches, each safe at any time.
GPU_SETTINGS = ("enabled", "one_model_at_a_time")


def configured_upstreams() -> list[Upstream]:
    """The GPUs `LLAMA_SWAP_URL` names (read at call time: tests change it)."""
    return parse_upstreams(settings.LLAMA_SWAP_URL)


@transaction.atomic
def gpu_register(*, name: str, url: str) -> Gpu:
    """The GPU's row, created, or its URL brought up to date."""
    gpu, created = Gpu.objects.select_for_update().get_or_create(name=name, defaults={"url": url})
    if not created and gpu.url != url:
        gpu.url = url
        gpu.save(update_fields=["url"])
    if created or gpu.url != url:
        queue_changed(kind="gpus")
        work_available()  # another GPU to run what waits
    return gpu


def gpu_configured(name: str | None = None) -> Gpu:
    """This process's GPU (`name`, else GPUSCHED_GPU) of LLAMA_SWAP_URL, registered."""
    wanted = name or settings.GPUSCHED_GPU
    upstreams = configured_upstreams()
    for upstream in upstreams:
        if upstream.name == wanted:
            return gpu_register(name=upstream.name, url=upstream.url)
    if name is None and len(upstreams) == 1:
        # One upstream is the one GPU, whatever GPUSCHED_GPU says.
        return gpu_register(name=upstreams[0].name, url=upstreams[0].url)
    known = ", ".join(upstream.name for upstream in upstreams)
    raise ImproperlyConfigured(
        f"GPUSCHED_GPU: {wanted!r} is not a GPU of LLAMA_SWAP_URL (it names {known})"
    )


def gpus_configured_register() -> list[Gpu]:
    return [gpu_register(name=u.name, url=u.url) for u in configured_upstreams()]


def gpu_state_record(
    *,
    gpu_id: int,
    reachable: bool,
    resident_model: str | None,
    error: str = "",
    served_models: Sequence[str] | None = None,
    running: ModelsRunning | None = None,
    announce_work: bool = True,
) -> None:
    """What the GPU's dispatcher saw at llama-swap. `served_models` None:
    the list was not read this time (kept as it was); `running`: every
    model's state and the foreign load, None when llama-swap was not read
    (unreachable: nothing is known to be loaded). `announce_work`: it may
    let waiting jobs run (llama-swap back, its models changed)."""
    changes: dict[str, object] = {
        "reachable": reachable,
        "resident_model": resident_model or "",
        "resident_models": list(running.ready) if running else [],
        "loading_models": list(running.loading) if running else [],
        "foreign_in_flight": running.foreign_in_flight if running else 0,
        "error": error,
        "checked_at": Now(),
    }
    with transaction.atomic():
        if served_models is not None:
            # With its names by its config: a job may name a model by an alias.
            routing = Gpu.objects.values_list("routing", flat=True).get(pk=gpu_id)
            changes["served_models"] = names_served(served_models, routing_of_parts(routing))
        Gpu.objects.filter(pk=gpu_id).update(**changes)
        queue_changed(kind="upstream")
        if announce_work:
            work_available()  # jobs that waited for a model or for llama-swap


def gpu_routing_record(
    *,
    gpu_id: int,
    routing: dict[str, object] | None,
    error: str,
    slots: Mapping[str, int] | None = None,
) -> None:
    """The routing its dispatcher read from llama-swap's config file
    (`routing_parts`), or null with the line that says why it cannot be
    used; both empty without a config; the names it serves follow the
    config's aliases (`names_served`). `slots`: each model's slots its
    `cmd` or `env` sets (queueapp/policy/server_slots.py); None: none known.
    The models' `parallel` is worked out again (their concurrencyLimits may
    have changed too)."""
    with transaction.atomic():
        lock_model_parallels()
        gpu = Gpu.objects.select_for_update().get(pk=gpu_id)
        before = gpu.routing_config
        gpu.routing, gpu.routing_error = routing, error
        gpu.model_slots = with_config_slots(gpu.model_slots, slots or {})
        if gpu.served_models is not None:
            gpu.served_models = names_served(gpu.served_models, gpu.routing_config, before=before)
        gpu.save(update_fields=["routing", "routing_error", "model_slots", "served_models"])
        queue_changed(kind="gpus")
        model_parallels_refresh()


def gpu_server_slots_record(*, gpu_id: int, model: str, slots: int) -> None:
    """`model`'s server on the GPU reported `slots` (llama-server's
    `total_slots`), recorded for its model id (`model` may be an alias);
    the models' `parallel` is worked out again."""
    with transaction.atomic():
        lock_model_parallels()
        gpu = Gpu.objects.select_for_update().get(pk=gpu_id)
        routing = gpu.routing_config
        with contextlib.suppress(UnknownModel):
            model = resolve(routing, model) if routing is not None else model
        stored = with_server_slots(gpu.model_slots, model, slots)
        if stored == gpu.model_slots:
            return
        gpu.model_slots = stored
        gpu.save(update_fields=["model_slots"])
        model_parallels_refresh()


@transaction.atomic
def gpu_update(
    *,
    gpu: Gpu,
    enabled: bool,
    allowed_models: Sequence[str],
    min_band: int | None,
    max_expected_seconds: float | None,
    one_model_at_a_time: bool | None = None,
) -> Gpu:
    """The operator enables or disables a GPU (a disabled one finishes its
    job and claims no other), narrows the models it runs, sets its
    reservation (queueapp/policy/placement.py) or its `one_model_at_a_time`
    (None: left as it is); each applies from its next claim."""
    if max_expected_seconds is not None and max_expected_seconds < 0:
        raise InvalidInput("must be 0 or more seconds", field="max_expected_seconds")
    lock_model_parallels()  # before the row, as every writer of slots takes it
    gpu.enabled = enabled
    gpu.allowed_models = sorted({model.strip() for model in allowed_models if model.strip()})
    gpu.min_band = min_band
    gpu.max_expected_seconds = max_expected_seconds
    if one_model_at_a_time is not None:
        gpu.one_model_at_a_time = one_model_at_a_time
    gpu.save(
        update_fields=[
            "enabled",
            "allowed_models",
            "min_band",
            "max_expected_seconds",
            "one_model_at_a_time",
        ]
    )
    queue_changed(kind="gpus")
    work_available()
    model_parallels_refresh()  # a disabled GPU's slots no longer count
    return gpu


@transaction.atomic  # not durable: as the other settings' changes
def gpu_settings_update(*, name: str, changes: Mapping[str, object]) -> Gpu:
    """Change the switches of GPU `name` that `changes` names (`GPU_SETTINGS`):

    - `enabled`: false, it finishes its jobs and claims no other.
    - `one_model_at_a_time`: true, it runs one model's jobs at a time, whatever
      llama-swap's routing keeps loaded together.

    Each applies from the GPU's next claim. NotFound for a GPU not registered."""
    unknown = sorted(set(changes) - set(GPU_SETTINGS))
    if unknown:
        raise InvalidInput("unknown setting", field=unknown[0])
    if not changes:
        raise InvalidInput("give one or both", field=" or ".join(GPU_SETTINGS))
    for field, value in changes.items():
        if not isinstance(value, bool):
            raise InvalidInput("must be true or false", field=field)
    lock_model_parallels()  # before the row, as every writer of slots takes it
    gpu = Gpu.objects.select_for_update().filter(name=name).first()
    if gpu is None:
        known = ", ".join(Gpu.objects.order_by("name").values_list("name", flat=True)) or "none"
        raise NotFound(f"no GPU named {name!r}; GPUs: {known}")
    for field, value in changes.items():
        setattr(gpu, field, value)
    gpu.save(update_fields=sorted(changes))
    queue_changed(kind="gpus")
    work_available()  # a GPU enabled, or a model freed to load beside another
    if "enabled" in changes:
        model_parallels_refresh()  # a disabled GPU's slots no longer count
    return gpu
