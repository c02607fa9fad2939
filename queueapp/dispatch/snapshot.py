"""What one claim reads of PostgreSQL: the snapshot `decide` decides on.

Two statements, each one round trip (the claim sits between two GPU jobs,
so every round trip and every ORM object counts, docs/benchmarks.md):

1. `gpu_state_read`: the clock, the GPU's row, its running jobs, the
   members holding GPUs with their tier's running limit, the other GPUs and
   the policy, read by column name into `GpuState`;
2. `heads_read`: the best queue-line heads by rank key that the GPU may
   take. It filters by the rules of `decide` where an index helps (the
   models the GPU runs, its reservation, the members at their running
   limit, jobs pinned to another GPU) and reads more than the winner needs, so the counterfactuals
   (who wins without a term) have a pool; tests/dispatch/
   test_decide_prefilter.py checks that the filter never drops the job
   `decide` would pick.

`decide` (queueapp/policy/decide.py) then holds every rule; claim.py
applies its decision.

Why filter in SQL and decide in Python: the rules live once, in a pure
function the forecast and the simulator call too, while the SQL only
narrows what an index can narrow (one scan per model the GPU runs), so the
claim reads a few dozen rows whatever the queue's length. Plain SQL read by
column name, not the ORM: the ORM version spent longer building queries and
objects than PostgreSQL spent answering them. The heads are read without
row locks: locking twenty rows per claim made a second GPU's claim skip
them all and find nothing. Only the winner's row is locked, by the
statement that starts it (SKIP LOCKED, queueapp/transitions.py).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from typing import Any

from queueapp.durations import Durations
from queueapp.liveness import JUDGING_SQL, LIVE_DISPATCHERS_SQL, LIVE_GATEWAYS_SQL, gateway_gone_sql
from queueapp.models import Gpu, Policy
from queueapp.policy import Candidate, PolicySettings
from queueapp.policy.decide import GpuSnapshot, HeadFilter, PeerGpu, Snapshot
from queueapp.policy.facts import (
    ClusterFacts,
    MemberLimits,
    cluster_facts,
    queued_candidate,
)
from queueapp.policy.resident_sets import ResidentSet, routing_of_text
from queueapp.policy.skip_record import Holding
from queueapp.prepared import prepared_cursor
from queueapp.selectors import policy_settings

# Heads read from each index and ranked at each claim: the winner is always
# among the first few; the rest let the counterfactuals find who would win
# without a term.
CANDIDATE_POOL = 20


@dataclass(frozen=True)
class GpuState:
    """What a claim reads of the database in its first statement: one row,
    its columns named as these fields (`gpu_state_read` builds it by name)."""

    now: datetime
    # The GPU's row: enabled, the models it runs, the resident model recorded.
    name: str
    url: str
    enabled: bool
    served_models: list[str] | None
    allowed_models: list[str]
    resident_model: str
    resident_models: list[str]  # every model llama-swap has ready, as last recorded
    loading_models: list[str]  # and those it is starting
    # llama-swap's routing as recorded (JSON text: parsed once per config),
    # and whether the GPU runs one model's jobs at a time all the same.
    routing_text: str | None
    one_model_at_a_time: bool
    min_band: int | None
    max_expected_seconds: float | None
    running_job_id: int | None  # one of them (a front-door job whose caller is gone first)
    running_lease_expires_at: datetime | None  # the earliest of their leases
    running_caller_gone: bool  # a front-door job whose web process died
    running_slots: list[int]
    running_model: str | None  # their model; None when two models are in flight
    running_model_parallel: int  # how many of its jobs the GPU may run at once
    # With a routing: the model of each running job, and each one's `parallel`.
    running_models: list[str] | None
    running_parallel: dict[str, int] | None
    previous_finished_at: datetime | None  # when the GPU last freed
    # Per member with running jobs: the GPUs they hold, their tier's limit,
    # whether it is strict (never lent past), and those jobs (id, GPU).
    members_holding: list[dict[str, Any]]
    # The other GPUs: name, resident model, idle, reserved, claiming (enabled,
    # reachable, its dispatcher alive).
    other_gpus: list[dict[str, Any]]
    # Enabled GPUs, whether their dispatcher runs now or not (one that
    # restarts must not hand its models to the others): with one, it runs
    # any model (Gpu.runs_models) and no running limit binds (it counts GPUs).
    gpu_count: int
    has_policy: bool
    dispatch_paused: bool | None
    aging_divisor: float | None
    swap_affinity_bonus: float | None
    band_spacing: int | None
    lease_seconds: float | None
    borrow_keep_idle_gpus: int | None
    borrow_max_seconds: float | None
    gpu_id: int = 0

    @cached_property
    def gpu(self) -> Gpu:
        return Gpu(
            pk=self.gpu_id,
            **{column: getattr(self, column) for column in _GPU_COLUMNS},
        )

    @cached_property
    def policy(self) -> Policy:
        policy = Policy(pk=1)  # the defaults, until an operator saves a policy
        if self.has_policy:
            for column in _POLICY_COLUMNS:
                setattr(policy, column, getattr(self, column))
        return policy

    @cached_property
    def settings(self) -> PolicySettings:
        return policy_settings(self.policy)

    @cached_property
    def facts(self) -> ClusterFacts:
        """What every decision of this instant rests on (policy/facts.py)."""
        policy = self.policy
        learned = (
            Durations.load().expected_per_model()
            if self.max_expected_seconds is not None or policy.borrow_max_seconds is not None
            else {}
        )
        return cluster_facts(
            enabled_gpus=self.gpu_count,
            gpus_held={row["member"]: frozenset(row["gpus"]) for row in self.members_holding},
            limits=MemberLimits(
                limits={row["member"]: row["limit"] for row in self.members_holding},
                strict=frozenset(row["member"] for row in self.members_holding if row["strict"]),
            ),
            keep_idle=policy.borrow_keep_idle_gpus,
            borrow_max_seconds=policy.borrow_max_seconds,
            expected_seconds=learned,
        )

    def holdings(self) -> list[Holding]:
        """The members with running jobs: their limit, and those jobs."""
        return [
            Holding(
                member_id=row["member"],
                limit=row["limit"],
                jobs=[(job_id, gpu) for job_id, gpu in row["jobs"]],
            )
            for row in self.members_holding
        ]

    def loaded_beside(self, resident_model: str | None) -> frozenset[str]:
        """Every model llama-swap has ready as the row last recorded, when it
        agrees with the claim's own reading (`resident_model` among them);
        otherwise the row is older than that reading and tells nothing."""
        recorded = frozenset(self.resident_models or ())
        return recorded if resident_model in recorded else frozenset()

    def resident_set(self, resident_model: str | None) -> ResidentSet | None:
        """The GPU as llama-swap's routing runs it (resident_sets.py); None
        without a usable routing (`side_by_side` False when it runs one
        model's jobs at a time: the routing then only predicts swaps). What
        llama-swap counts as running: the row's ready and starting models,
        the claim's own reading and the models gpusched has jobs in flight of."""
        routing = routing_of_text(self.routing_text)
        if routing is None:
            return None
        in_flight = list(self.running_models or ())
        running = {*self.resident_models, *self.loading_models, *in_flight}
        if resident_model:
            running.add(resident_model)
        return ResidentSet(
            routing=routing,
            running_names=frozenset(running),
            in_flight=Counter(in_flight),
            parallel=self.running_parallel or {},
            side_by_side=not self.one_model_at_a_time,
        )

    def snapshot(self, *, resident_model: str | None) -> Snapshot:
        """The state as `decide` reads it, without heads (read next)."""
        facts = self.facts
        return Snapshot(
            now=self.now.timestamp(),
            gpu=GpuSnapshot(
                name=self.name,
                resident_model=resident_model,
                resident_models=self.loaded_beside(resident_model),
                runs_models=facts.runs(self.served_models, self.allowed_models),
                min_band=self.min_band,
                short_models=facts.short_models(self.max_expected_seconds),
                short_under=self.max_expected_seconds,
                slots_taken=frozenset(self.running_slots),
                in_flight_model=self.running_model,
                slots=self.running_model_parallel,
                enabled=self.enabled,
                sets=self.resident_set(resident_model),
            ),
            heads=(),
            settings=self.settings,
            others=[
                PeerGpu(
                    name=other["name"],
                    resident_model=other["resident_model"] or None,
                    resident_models=frozenset(other["resident_models"] or ()),
                    idle=other["idle"],
                    reserved=other["reserved"],
                    claiming=other["claiming"],
                )
                for other in self.other_gpus
            ],
            gpus_held=facts.gpus_held,
            running_limit=facts.running_limit,
            borrowing=facts.borrowing,
            paused=self.policy.dispatch_paused,
        )


_POLICY_COLUMNS = (
    "dispatch_paused",
    "aging_divisor",
    "swap_affinity_bonus",
    "band_spacing",
    "lease_seconds",
    "borrow_keep_idle_gpus",
    "borrow_max_seconds",
)
_GPU_COLUMNS = (
    "name",
    "url",
    "enabled",
    "served_models",
    "allowed_models",
    "resident_model",
    "resident_models",
    "min_band",
    "max_expected_seconds",
)


# `gpu_state_read`'s statement: its columns named as `GpuState`'s fields.
_GPU_STATE_SQL = f"""
            SELECT now() AS now, gpu.name, gpu.url, gpu.enabled, gpu.served_models,
                   gpu.allowed_models, gpu.resident_model, gpu.resident_models,
                   gpu.loading_models, gpu.min_band, gpu.max_expected_seconds,
                   gpu.routing::text AS routing_text, gpu.one_model_at_a_time,
                   running.id AS running_job_id,
                   running.lease_expires_at AS running_lease_expires_at,
                   running.caller_gone AS running_caller_gone,
                   running.slots AS running_slots, running.model AS running_model,
                   coalesce((SELECT setting.parallel FROM queueapp_modelsetting AS setting
                              WHERE setting.name = running.model), 1)
                       AS running_model_parallel,
                   CASE WHEN gpu.routing IS NOT NULL THEN running.models END AS running_models,
                   CASE WHEN gpu.routing IS NOT NULL
                        THEN (SELECT coalesce(json_object_agg(setting.name, setting.parallel),
                                              '{{}}')
                                FROM queueapp_modelsetting AS setting
                               WHERE setting.name = ANY(running.models)) END
                       AS running_parallel,
                   previous.finished_at AS previous_finished_at,
                   holding.members AS members_holding, others.gpus AS other_gpus,
                   others.enabled AS gpu_count,
                   policy.id IS NOT NULL AS has_policy, policy.dispatch_paused,
                   policy.aging_divisor, policy.swap_affinity_bonus, policy.band_spacing,
                   policy.lease_seconds, policy.borrow_keep_idle_gpus, policy.borrow_max_seconds
              FROM queueapp_gpu AS gpu
              CROSS JOIN LATERAL (
                   -- Its running jobs: one, or several of one model sharing it.
                   SELECT coalesce(min(job.id) FILTER (WHERE job.gone), min(job.id)) AS id,
                          min(job.lease_expires_at) AS lease_expires_at,
                          coalesce(bool_or(job.gone), false) AS caller_gone,
                          CASE WHEN count(DISTINCT job.model) = 1 THEN min(job.model) END AS model,
                          coalesce(array_agg(job.gpu_slot), '{{}}') AS slots,
                          coalesce(array_agg(job.model), '{{}}') AS models
                     FROM (SELECT id, lease_expires_at, model, gpu_slot,
                                  {gateway_gone_sql("gateway")} AS gone
                             FROM queueapp_job
                            WHERE status = 'running' AND gpu_id = gpu.id) AS job) AS running
              LEFT JOIN LATERAL (
                   SELECT job.finished_at FROM queueapp_dispatchdecision AS decision
                     JOIN queueapp_job AS job ON job.id = decision.job_id
                    WHERE decision.gpu_id = gpu.id
                    ORDER BY decision.id DESC LIMIT 1) AS previous ON true
              CROSS JOIN LATERAL (
                   -- The running limit counts GPUs held (jobs sharing one
                   -- GPU's slots hold one): decide.at_running_limit.
                   SELECT coalesce(json_agg(json_build_object(
                              'member', held.member_id, 'gpus', held.gpus,
                              'limit', held.max_running_jobs,
                              'strict', held.strict_running_limit,
                              'jobs', held.jobs)), '[]') AS members
                     FROM (SELECT job.member_id, tier.max_running_jobs,
                                  tier.strict_running_limit,
                                  array_agg(DISTINCT holder.name) AS gpus,
                                  json_agg(json_build_array(job.id, holder.name)
                                           ORDER BY job.started_at, job.id) AS jobs
                             FROM queueapp_job AS job
                             JOIN queueapp_gpu AS holder ON holder.id = job.gpu_id
                             JOIN queueapp_member AS member ON member.id = job.member_id
                             JOIN queueapp_tier AS tier ON tier.id = member.tier_id
                            WHERE job.status = 'running'
                            GROUP BY job.member_id, tier.max_running_jobs,
                                     tier.strict_running_limit) AS held) AS holding
              CROSS JOIN LATERAL (
                   SELECT count(*) FILTER (WHERE other.enabled) AS enabled,
                          coalesce(json_agg(json_build_object(
                              'name', other.name, 'resident_model', other.resident_model,
                              'resident_models', other.resident_models,
                              'reserved', other.min_band IS NOT NULL
                                          OR other.max_expected_seconds IS NOT NULL,
                              'claiming', other.enabled AND other.reachable
                                          AND other.id IN ({LIVE_DISPATCHERS_SQL}),
                              'idle', NOT EXISTS (
                                  SELECT 1 FROM queueapp_job AS job
                                   WHERE job.status = 'running' AND job.gpu_id = other.id)))
                              FILTER (WHERE other.id <> gpu.id), '[]') AS gpus
                     FROM queueapp_gpu AS other) AS others
              LEFT JOIN queueapp_policy AS policy ON policy.id = 1
             WHERE gpu.id = %s
"""


def gpu_state_read(gpu_id: int) -> GpuState:
    """The clock, the GPU, its running jobs, the members holding GPUs, the
    other GPUs and the policy, in one round trip."""
    with prepared_cursor() as cursor:
        cursor.execute(
            _GPU_STATE_SQL,
            [gpu_id],
        )
        row = cursor.fetchone()
        names = [column.name for column in cursor.description]
    if row is None:
        raise Gpu.DoesNotExist(f"no GPU with id {gpu_id}")
    # By name: a column added, dropped or renamed fails here, at once.
    return GpuState(gpu_id=gpu_id, **dict(zip(names, row, strict=True)))


@dataclass(frozen=True)
class Head:
    candidate: Candidate
    path: str
    attempts: int
    front_door: bool
    gateway: int | None
    caller_gone: bool  # a front-door job whose web process died: never granted

    @classmethod
    def of(cls, row: tuple[Any, ...], column: dict[str, int]) -> Head:
        """From a row of `heads_read`'s statement, its columns found by name."""
        return cls(
            queued_candidate(
                job_id=row[column["job_id"]],
                band=row[column["band"]],
                tier_bonus=row[column["tier_bonus"]],
                model=row[column["model"]],
                submitted_at=row[column["submitted_at"]].timestamp(),
                member_id=row[column["member_id"]],
                is_lane_head=True,  # the statement reads only heads
                eligible_at=row[column["eligible_at"]].timestamp(),
                pinned_gpu=row[column["pinned_gpu"]],
                wait_deadline=(
                    deadline.timestamp() if (deadline := row[column["wait_deadline"]]) else None
                ),
                shortness=row[column["shortness"]],
                expected_seconds=row[column["expected_p50"]],
            ),
            path=row[column["path"]],
            attempts=row[column["attempts"]],
            front_door=row[column["front_door"]],
            gateway=row[column["gateway"]],
            caller_gone=row[column["caller_gone"]],
        )

    @property
    def next_attempt(self) -> int:
        return self.attempts + 1


_BEST_HEADS = """
    SELECT id{rank} FROM queueapp_job
     WHERE status = 'queued' AND is_lane_head AND {model}
       AND member_id <> ALL(%(capped)s)
       AND (pinned_gpu = '' OR pinned_gpu = %(gpu_name)s)
       AND (NOT %(reserved)s OR priority >= %(min_band)s
            OR (expected_p50 IS NULL AND model = ANY(%(short)s))
            OR expected_p50 < %(short_under)s::float8)
     ORDER BY rank_key DESC, id LIMIT %(limit)s
"""
# A reservation without a band floor admits no band by it.
_NO_BAND = 2**31 - 1


def heads_read(wanted: HeadFilter) -> dict[int, Head]:
    """The best line heads by key among the models the GPU runs, and those
    of the affinity model (its bonus may lift one above the first), but
    those `wanted` leaves out (decide.prefilter: members at their running
    limit, jobs pinned to another GPU, those the GPU's reservation keeps
    out). More than the winner needs, so the counterfactuals (who wins
    without a term) have a pool to choose from. Not locked: the winner's
    row is, when it is marked running."""
    with prepared_cursor() as cursor:
        cursor.execute(
            _heads_sql(every_model=wanted.models is None, affinity=len(wanted.affinity_models)),
            {
                "limit": CANDIDATE_POOL,
                "affinity": sorted(wanted.affinity_models),
                "model": min(wanted.affinity_models) if wanted.affinity_models else None,
                "runs": None if wanted.models is None else sorted(wanted.models),
                "capped": sorted(wanted.capped_members),
                "gpu_name": wanted.gpu,
                "reserved": wanted.reserved,
                "min_band": _NO_BAND if wanted.min_band is None else wanted.min_band,
                "short": sorted(wanted.short_models or ()),
                "short_under": wanted.short_under,
            },
        )
        # By name: each column's place is looked up once, not per row.
        column = {c.name: index for index, c in enumerate(cursor.description or ())}
        rows = cursor.fetchall()
    return {row[column["job_id"]]: Head.of(row, column) for row in rows}


def _best_per_model(models: str) -> str:
    """The best heads of each model of the array parameter `models`: one
    index scan per model (`job_queued_model_rank`), however rare."""
    per_model = _BEST_HEADS.format(rank=", rank_key", model="model = models.model")
    return f"""(
        SELECT best.id FROM unnest(%({models})s::varchar[]) AS models(model)
         CROSS JOIN LATERAL ({per_model}) AS best
         ORDER BY best.rank_key DESC, best.id LIMIT %(limit)s)
    """


def _heads_sql(*, every_model: bool, affinity: int) -> str:
    """The heads' statement: its columns named as `Head.of` reads them.
    `affinity`: how many models affinity is scored for (one, the common
    case, is read by a plain index scan)."""
    wanted = (
        f"({_BEST_HEADS.format(rank='', model='true')})" if every_model else _best_per_model("runs")
    )
    if affinity == 1:
        wanted += f" UNION ALL ({_BEST_HEADS.format(rank='', model='model = %(model)s')})"
    elif affinity > 1:
        wanted += f" UNION ALL {_best_per_model('affinity')}"
    return f"""
        SELECT job.id AS job_id, job.priority AS band, tier.bonus AS tier_bonus, job.model,
               job.submitted_at, job.eligible_at, job.member_id, job.path, job.attempts,
               job.front_door, job.gateway, job.pinned_gpu, job.wait_deadline, job.shortness,
               job.expected_p50,
               job.gateway IS NOT NULL AND NOT job.gateway = ANY(live.id) AND {JUDGING_SQL}
                   AS caller_gone
          FROM queueapp_job AS job
          CROSS JOIN LATERAL (SELECT coalesce(array_agg(objid), '{{}}') AS id
                                FROM ({LIVE_GATEWAYS_SQL}) AS alive(objid)) AS live
          JOIN queueapp_member AS member ON member.id = job.member_id
          JOIN queueapp_tier AS tier ON tier.id = member.tier_id
         WHERE job.id IN ({wanted}) AND job.status = 'queued' AND job.is_lane_head
    """
