"""The GPUs: one llama-swap upstream each, and the models it may be given."""

from __future__ import annotations

from collections.abc import Sequence

from django.contrib.postgres.fields import ArrayField
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models.functions import Now

from queueapp.job_body import MAX_GPU_NAME, MAX_MODEL_NAME
from queueapp.policy.facts import models_run
from queueapp.policy.placement import Reservation
from queueapp.policy.resident_sets import routing_of_parts
from queueapp.policy.routing import RoutingConfig


class Gpu(models.Model):
    """One GPU: one llama-swap upstream, driven by a dispatcher of its own.

    Registered by its dispatcher (and by `make run`); the dispatcher keeps
    what it last saw of llama-swap current here. The web servers read the
    URL to make a front-door call on it, so it must be reachable from them.
    """

    name = models.CharField(max_length=MAX_GPU_NAME, unique=True)
    url = models.URLField(max_length=500, help_text="Its llama-swap, as the web servers reach it.")
    enabled = models.BooleanField(
        default=True,
        help_text="Disabled: it finishes the job it runs and claims no other.",
    )
    # As llama-swap lists them at GET /v1/models; null until first read.
    served_models = ArrayField(models.CharField(max_length=MAX_MODEL_NAME), null=True, blank=True)
    allowed_models = ArrayField(
        models.CharField(max_length=MAX_MODEL_NAME),
        default=list,
        blank=True,
        help_text="Narrows the models it runs to these (of those llama-swap serves); "
        "empty: every model it serves.",
    )
    # Reservation: when either is set, the GPU takes only jobs of at least
    # `min_band`, or jobs expected to run under `max_expected_seconds`, so
    # interactive work always finds a GPU not stuck in a long render.
    min_band = models.IntegerField(
        null=True,
        blank=True,
        help_text="Reservation: take only jobs of at least this band (or short ones, below).",
    )
    max_expected_seconds = models.FloatField(
        null=True,
        blank=True,
        validators=[MinValueValidator(0)],
        help_text="Reservation: take jobs of a lower band only when expected to run under "
        "this many seconds.",
    )
    reachable = models.BooleanField(default=False)
    # The model that became ready last; `resident_models` holds every one.
    resident_model = models.CharField(max_length=MAX_MODEL_NAME, blank=True)
    # What llama-swap reports (queueapp/upstream/llama_swap_state.py): every
    # `ready` model and every `starting` one, sorted, and the requests in
    # flight there that did not come through gpusched.
    # Database defaults: a process of the previous release, which writes
    # rows without these columns, keeps working during an upgrade.
    resident_models = ArrayField(
        models.CharField(max_length=MAX_MODEL_NAME), db_default=[], default=list, blank=True
    )
    loading_models = ArrayField(
        models.CharField(max_length=MAX_MODEL_NAME), db_default=[], default=list, blank=True
    )
    foreign_in_flight = models.PositiveIntegerField(db_default=0, default=0)
    checked_at = models.DateTimeField(null=True, blank=True)
    error = models.TextField(blank=True)
    # llama-swap's routing, from its config file (LLAMA_SWAP_CONFIG) as the
    # dispatcher last read it: the parts `policy.routing.routing_from_config`
    # reads (`routing_parts`), so any process builds the same routing; null
    # without a config, or while it cannot be used, and then
    # `routing_error` is the one line that says why (file, key, reason).
    routing = models.JSONField(null=True, blank=True)
    routing_error = models.TextField(db_default="", default="", blank=True)
    # Each model's slots on this GPU, by model id, as its dispatcher last
    # learned them: {"slots": N, "source": "config" | "server"}
    # (queueapp/policy/server_slots.py). A config read replaces them all (a
    # reload restarts llama-swap's models); a server's count, read when its
    # model becomes ready, replaces the config's.
    model_slots = models.JSONField(db_default={}, default=dict, blank=True)
    one_model_at_a_time = models.BooleanField(
        db_default=False,
        default=False,
        help_text="Run one model's jobs at a time, whatever llama-swap's routing keeps loaded "
        "together (the rule before resident sets).",
    )
    registered_at = models.DateTimeField(db_default=Now())

    # Whether a live dispatcher holds it: set on the rows `selectors.gpus_list`
    # reads; None on a row read another way, which does not know.
    dispatcher_alive: bool | None = None

    class Meta:
        ordering = ["name"]
        verbose_name = "GPU"

    def __str__(self) -> str:
        return self.name

    @property
    def reservation(self) -> Reservation:
        """Its reservation (queueapp/policy/placement.py), unset when neither is."""
        return Reservation(self.min_band, self.max_expected_seconds)

    @property
    def config_models(self) -> list[str] | None:
        """The model ids of its llama-swap config, sorted; None without one."""
        if self.routing is None:
            return None
        return sorted(self.routing.get("models") or {})

    @property
    def routing_config(self) -> RoutingConfig | None:
        """Its llama-swap routing (queueapp/policy/routing.py); None without
        a config it can use."""
        # Built once per distinct config; None when a newer reader refuses
        # what was stored once accepted.
        return routing_of_parts(self.routing)

    @staticmethod
    def routing_configs(gpus: Sequence[Gpu]) -> dict[str, RoutingConfig]:
        """The routing of each of `gpus` that has one, by GPU name."""
        return {gpu.name: config for gpu in gpus if (config := gpu.routing_config) is not None}

    @property
    def reserved(self) -> bool:
        return self.reservation.reserved

    def runs_models(self, *, alone: bool = False) -> list[str] | None:
        """The models it may be given (served, narrowed by the operator);
        None (any model) when llama-swap's list is not read yet and no
        narrowing is set. `alone`: it is the only enabled GPU, so there is no
        placement to make, and it is given any model but those the operator
        left out, as a single llama-swap is (models llama-swap does not list,
        `unlisted` ones included, are its to answer). The rule is
        policy/facts.py `models_run`; this keeps the lists' order."""
        runs = models_run(self.served_models, self.allowed_models, alone=alone)
        if runs is None:
            return None
        listed = self.allowed_models if self.served_models is None or alone else self.served_models
        return [model for model in listed if model in runs]

    @staticmethod
    def models_served(enabled: Sequence[Gpu]) -> frozenset[str] | None:
        """Every model some of the `enabled` GPUs runs; None (any model) when
        one GPU alone runs any, or a GPU's list is not read yet."""
        if len(enabled) <= 1:
            return None
        served: set[str] = set()
        for gpu in enabled:
            runs = gpu.runs_models()
            if runs is None:
                return None
            served.update(runs)
        return frozenset(served)
