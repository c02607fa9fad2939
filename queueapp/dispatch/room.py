"""Which GPUs a front-door admission tries: those with room for its model.

One statement for every GPU (a front-door call pays for it), read into
`GpuSnapshot`s so that the rule is `decide`'s own (`has_room_for`); the
claim on each GPU then decides (claim.py).
"""

from __future__ import annotations

from collections import Counter

from queueapp.liveness import LIVE_DISPATCHERS_SQL
from queueapp.policy.decide import GpuSnapshot
from queueapp.policy.facts import gpus_alone, models_run
from queueapp.policy.resident_sets import ResidentSet, routing_of_text
from queueapp.prepared import prepared_cursor

_ROOM_SQL = f"""
    SELECT gpu.id, gpu.name, gpu.enabled, gpu.served_models, gpu.allowed_models,
           gpu.resident_model, gpu.resident_models, gpu.loading_models,
           gpu.routing::text AS routing_text, gpu.one_model_at_a_time,
           gpu.enabled AND gpu.reachable AND gpu.id IN ({LIVE_DISPATCHERS_SQL}) AS claiming,
           running.slots, running.models,
           coalesce((SELECT json_object_agg(setting.name, setting.parallel)
                       FROM queueapp_modelsetting AS setting
                      WHERE setting.name = ANY(running.models)), '{{}}') AS parallel
      FROM queueapp_gpu AS gpu
     CROSS JOIN LATERAL (
           SELECT coalesce(array_agg(job.gpu_slot), '{{}}') AS slots,
                  coalesce(array_agg(job.model), '{{}}') AS models
             FROM queueapp_job AS job
            WHERE job.status = 'running' AND job.gpu_id = gpu.id) AS running
     ORDER BY gpu.id
"""


def gpus_with_room_for(model: str) -> list[int]:
    """The GPUs a front-door admission tries for a job of `model`: those
    that could start it now by `decide`'s rules of the GPU itself
    (`GpuSnapshot.has_room_for`: it claims, runs the model, and has a free
    slot beside the jobs in flight), where it is loaded first. Only a
    pre-filter, as `heads_read` is: on each, `decide` rules."""
    with prepared_cursor() as cursor:
        cursor.execute(_ROOM_SQL)
        names = [column.name for column in cursor.description or ()]
        rows = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
    alone = gpus_alone(sum(1 for row in rows if row["enabled"]))
    room = [
        row for row in rows if row["claiming"] and _snapshot(row, alone=alone).has_room_for(model)
    ]
    room.sort(key=lambda row: model not in _loaded(row))  # stable: then by id
    return [row["id"] for row in room]


def _loaded(row: dict) -> set[str]:
    return {row["resident_model"], *row["resident_models"], *row["models"]}


def _snapshot(row: dict, *, alone: bool) -> GpuSnapshot:
    models_in_flight: list[str] = row["models"]
    distinct = set(models_in_flight)
    routing = routing_of_text(row["routing_text"])
    sets = None
    if routing is not None:
        sets = ResidentSet(
            routing=routing,
            running_names=frozenset((_loaded(row) | set(row["loading_models"])) - {""}),
            in_flight=Counter(models_in_flight),
            parallel=row["parallel"],
            side_by_side=not row["one_model_at_a_time"],
        )
    in_flight_model = min(distinct) if len(distinct) == 1 else None
    return GpuSnapshot(
        name=row["name"],
        runs_models=models_run(row["served_models"], row["allowed_models"], alone=alone),
        slots_taken=frozenset(row["slots"]),
        in_flight_model=in_flight_model,
        slots=row["parallel"].get(in_flight_model, 1) if in_flight_model else 1,
        sets=sets,
    )
