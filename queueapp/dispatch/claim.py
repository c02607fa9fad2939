"""The claim: which queued job takes the GPU next, and marking it running.

`job_claim_next` is one short transaction of named steps, for one GPU:

1. take the GPU's claim lock (queueapp/locks.py: claims for different GPUs
   run at once);
2. read the GPU's state: the clock, its running jobs, the models it runs,
   the members at their tier's running limit, the policy;
3. if its slots are full (one, unless its loaded model's `parallel` says
   more), the GPU is busy: say until when;
4. read the candidates: the best line heads by rank key among the models
   the GPU runs, and those of its resident model;
5. rank them (`queueapp.policy.rank`: the decision itself); with jobs in
   flight, a winner of another model means the GPU drains: nothing starts;
6. mark the winner running on this GPU, under a lease (its row locked
   without waiting: another GPU's claim may hold it);
7. move its lane on (queueapp/lanes.py: fair share inside a band) and
   record the decision and the job's `started` event (decisions.py), in
   one statement.

Each step is one plain-SQL statement: the claim sits between two GPU jobs,
so every round trip and every ORM object counts (docs/benchmarks.md). What
happens to a running job afterwards (lease renewal, finish, return to the
queue, recovery when its dispatcher died) is in lease.py.

None of it is ever open while the job's body travels to llama-swap. The
GPU's claim lock serialises "is the GPU free?" between two dispatchers of
it (a re-delivered django-q2 task, a second cluster started by mistake),
and a partial unique index (one running job per GPU slot) makes a second
running job impossible even if that lock were bypassed.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from functools import cached_property
from typing import Any

from django.db import connection, transaction
from psycopg.types.json import Jsonb

from queueapp.dispatch.decisions import LEADING_CANDIDATES, decision_record
from queueapp.eta import Durations
from queueapp.gateways import JUDGING_SQL, LIVE_GATEWAYS_SQL, gateway_gone_sql
from queueapp.gpus import LIVE_DISPATCHERS_SQL
from queueapp.lanes import lane_dispatched_sql
from queueapp.locks import (
    MEMBER_LINES_LOCK,
    lock_gpu_claim,
    lock_member_lines,
    try_lock_gpu_claim,
    try_lock_member_lines,
)
from queueapp.models import Gpu, Job, Policy
from queueapp.policy import Candidate, PolicySettings, RankedCandidate, rank_key
from queueapp.policy.decide import GpuSnapshot, Outcome, Snapshot, at_running_limit, decide
from queueapp.prepared import prepared_cursor
from queueapp.selectors import policy_settings
from queueapp.services.gpus import gpu_configured
from queueapp.services.jobs import job_queue

# Heads read from each index and ranked at each claim: the winner is always
# among the first few; the rest let the counterfactuals find who would win
# without a term.
CANDIDATE_POOL = 20
# Longest wait before looking again at a job another dispatcher runs.
BUSY_RECHECK_SECONDS = 5.0


@dataclass(frozen=True)
class ClaimedJob:
    job_id: int
    path: str
    body: Any
    model: str
    claim_token: str  # fences a late finish after the lease was lost
    lease_seconds: float
    swap_needed: bool | None  # None: not known here, read from the decision at finish
    # The caller's connection makes the call (OpenAI front door); the
    # dispatcher only holds the GPU for it until the job ends.
    granted: bool = False
    effective_score: float | None = None  # as ranked at the claim
    gpu_id: int | None = None  # the GPU it was claimed for
    upstream_url: str = ""  # that GPU's llama-swap (its row's URL at the claim)
    gpu_slot: int = 0
    in_flight: int = 1  # jobs running on the GPU with it, itself included
    # Its model's jobs may share the GPU (parallel > 1): the dispatcher runs
    # it alongside others rather than waiting for its end.
    shared: bool = False

    @classmethod
    def recorded_on(cls, job: Job) -> ClaimedJob:
        """The claim a running job's row records (its token), to end the job
        as its holder would."""
        return cls(
            job_id=job.pk,
            path=job.path,
            body=None,
            model=job.model,
            claim_token=job.lease_owner,
            lease_seconds=0,
            swap_needed=None,
            granted=job.front_door,
            gpu_id=job.gpu_id,
        )


@dataclass(frozen=True)
class GpuBusy:
    """Another dispatcher's job holds the GPU until its lease expires."""

    job_id: int
    seconds_left: float  # until its lease expires, bounded to a short re-check
    # A front-door job whose caller's web process died: nobody will use or
    # end it, so it is failed now rather than at lease expiry.
    caller_gone: bool = False
    # Slots are free, but a better job of another model waits for the jobs
    # in flight to end (a swap is exclusive): none is given meanwhile.
    draining: bool = False


@dataclass(frozen=True)
class CallersGone:
    """The only queued heads are front-door jobs whose web process died: cancel
    them (services.front_door_orphans_cancel) and claim again."""

    job_ids: list[int]


class _LinesBusy(Exception):
    """The chosen job is held: its member is changing its lines (a
    submission, a cancel), or another GPU's claim is taking it. Nothing was
    written."""


# The change holding the lines lock is one short transaction.
LINES_BUSY_RETRY_SECONDS = 0.005
LINES_BUSY_MAX_TRIES = 200


def job_claim_next(
    *, resident_model: str | None, worker: str, gpu: int | None = None
) -> ClaimedJob | GpuBusy | CallersGone | None:
    """Mark the best queued job that GPU `gpu` (an id; None: this process's
    configured GPU) can run running on it, and record why; None when
    nothing to do."""
    gpu_id = gpu if gpu is not None else gpu_configured().pk
    for _ in range(LINES_BUSY_MAX_TRIES - 1):
        try:
            return _claim_next(resident_model=resident_model, worker=worker, gpu_id=gpu_id)
        except _LinesBusy:
            time.sleep(LINES_BUSY_RETRY_SECONDS)
    return _claim_next(
        resident_model=resident_model, worker=worker, gpu_id=gpu_id, wait_for_lines=True
    )


def gateway_claim(
    *, gateway: int, worker: str, gpu: int | None = None, model: str | None = None
) -> ClaimedJob | None:
    """The same claim, made by a front-door web process for its own waiting
    callers (no hop through the dispatcher), inside the caller's transaction:
    the one that queued a call's job (`model` its model: the idle GPUs that
    run it are tried, the one with it loaded first), or the one that ended
    the last on GPU `gpu`.

    It never waits for a lock: it only tries the GPU's claim lock and the
    winner's row, so taking them after the member's lines lock or a job's
    row (queueapp/locks.py) cannot deadlock. It scores swap affinity by the
    resident model the dispatcher last recorded, and grants only when the
    winner is one of that gateway's jobs: whoever the score picks, the
    dispatcher would grant the same job. None, with nothing written, when
    the GPU is busy, its dispatcher is claiming, or another job wins.
    """
    assert connection.in_atomic_block, "gateway_claim runs inside the caller's transaction"
    gpu_ids = [gpu] if gpu is not None else _idle_gpus_running(model)
    for gpu_id in gpu_ids:
        claim = _claim_in_transaction(
            resident_model=None, worker=worker, gpu_id=gpu_id, for_gateway=gateway
        )
        if claim is not None:
            return claim
    return None


def claim_after_an_end(*, gpu: int, resident_model: str | None, worker: str) -> ClaimedJob | None:
    """The dispatcher's claim of GPU `gpu`'s next job, inside the
    transaction that ended its last (`lease.job_finish_and_claim_next`): one
    commit fewer between two jobs of a backlog. It holds the ended job's
    row, so it only tries its locks (queueapp/locks.py); None, with nothing
    written, when a lock is held, the GPU is taken, or nothing waits: the
    dispatcher then claims as usual."""
    assert connection.in_atomic_block, "claim_after_an_end runs inside the end's transaction"
    return _claim_in_transaction(
        resident_model=resident_model, worker=worker, gpu_id=gpu, for_gateway=None
    )


def _claim_in_transaction(
    *, resident_model: str | None, worker: str, gpu_id: int, for_gateway: int | None
) -> ClaimedJob | None:
    """The claim's steps inside a transaction that holds other locks: every
    lock only tried; None, with nothing written, unless a job was claimed."""
    try:
        outcome = _claim_steps(
            resident_model=resident_model,
            worker=worker,
            gpu_id=gpu_id,
            for_gateway=for_gateway,
            wait_for_gpu=False,
        )
    except _LinesBusy:
        return None
    return outcome if isinstance(outcome, ClaimedJob) else None


def _idle_gpus_running(model: str | None) -> list[int]:
    """Enabled GPUs whose dispatcher lives, that may run `model` and have
    room for it: nothing running, or a free slot among jobs of that model;
    where it is loaded first."""
    with prepared_cursor() as cursor:
        cursor.execute(
            f"""
            SELECT gpu.id FROM queueapp_gpu AS gpu
             CROSS JOIN LATERAL (
                   SELECT count(*) AS count, count(*) FILTER (WHERE job.model <> %(model)s) AS other
                     FROM queueapp_job AS job
                    WHERE job.status = 'running' AND job.gpu_id = gpu.id) AS running
             WHERE gpu.enabled AND gpu.reachable
               AND gpu.id IN ({LIVE_DISPATCHERS_SQL})
               AND running.other = 0
               AND running.count < coalesce((SELECT setting.parallel
                                               FROM queueapp_modelsetting AS setting
                                              WHERE setting.name = %(model)s), 1)
               AND (gpu.served_models IS NULL OR %(model)s = ANY(gpu.served_models)
                    OR (SELECT count(*) FROM queueapp_gpu WHERE enabled) = 1)
               AND (gpu.allowed_models = '{{}}' OR %(model)s = ANY(gpu.allowed_models))
             ORDER BY gpu.resident_model = %(model)s DESC, gpu.id
            """,
            {"model": model or ""},
        )
        return [row[0] for row in cursor.fetchall()]


def _claim_next(
    *, resident_model: str | None, worker: str, gpu_id: int, wait_for_lines: bool = False
) -> ClaimedJob | GpuBusy | CallersGone | None:
    with transaction.atomic(durable=True):
        return _claim_steps(
            resident_model=resident_model,
            worker=worker,
            gpu_id=gpu_id,
            for_gateway=None,
            wait_for_gpu=True,
            wait_for_lines=wait_for_lines,
        )


@transaction.atomic(durable=True)
def job_submit_and_claim(
    *, gateway: int, worker: str, claim: bool = True, **submission: Any
) -> tuple[Job, ClaimedJob | None]:
    """A front-door call's job queued (`services.job_queue`, `submission` its
    arguments) and, in the same transaction and commit, `gateway_claim`:
    granted at once when the GPU is idle and the score picks it. `claim`
    False: the caller knows the GPU is busy; only the job is queued."""
    job = job_queue(gateway=gateway, front_door=True, **submission)
    if not claim:
        return job, None
    return job, gateway_claim(gateway=gateway, worker=worker, model=job.model)


def _claim_steps(
    *,
    resident_model: str | None,
    worker: str,
    gpu_id: int,
    for_gateway: int | None,
    wait_for_gpu: bool,
    wait_for_lines: bool = False,
) -> ClaimedJob | GpuBusy | CallersGone | None:
    """The claim's steps for GPU `gpu_id`, in the caller's transaction.
    `wait_for_gpu`: wait for the GPU's claim lock (the dispatcher's own
    transaction) or only try it (a transaction holding other locks)."""
    if not _lock_claims(gpu_id, wait=wait_for_gpu):
        return None  # its dispatcher is claiming: it grants the best job
    state = _gpu_state(gpu_id)
    if for_gateway is not None:
        resident_model = state.gpu.resident_model or None
    snapshot = state.snapshot(resident_model=resident_model)
    closed = snapshot.closed()
    if state.running_job_id is not None and (closed is Outcome.FULL or state.running_caller_gone):
        return _busy(state, state.running_job_id)
    if closed is not None:
        return None
    settings = snapshot.settings
    gpu = snapshot.gpu
    all_heads = _candidates(
        runs_models=gpu.runs_models,
        resident_model=gpu.affinity_model,
        capped_members=state.capped_members(snapshot),
        gpu=state.gpu,
        short_models=gpu.short_models,
    )
    # A caller whose web process died is never granted the GPU.
    heads = {job_id: head for job_id, head in all_heads.items() if not head.caller_gone}
    if not heads:
        return CallersGone(sorted(all_heads)) if all_heads else None
    decision = decide(
        replace(snapshot, heads=[head.candidate for head in heads.values()]),
        # Terms for as many as claims at the same instant may need to skip.
        top=max(LEADING_CANDIDATES, state.gpu_count),
    )
    if decision.outcome is Outcome.DRAIN:
        # A better job of another model waits for this GPU: it drains, and
        # its model gets no new slot, or a stream of its jobs would hold
        # the swap off for ever.
        assert state.running_job_id is not None  # jobs are in flight
        return _busy(state, state.running_job_id, draining=True)
    if decision.outcome is not Outcome.START:
        return None
    resident_model = decision.affinity_model
    sharing = gpu.in_flight_model if gpu.slots_taken else None
    ranked = list(decision.ranked)
    claim, ranked = _start_first_free(
        ranked,
        heads,
        state=state,
        resident_model=resident_model,
        worker=worker,
        for_gateway=for_gateway,
        wait_for_lines=wait_for_lines,
        sharing=sharing,
    )
    if claim is None:
        return None  # the dispatcher grants it; nothing is written here
    winner = heads[claim.job_id]
    decision_record(
        gpu=state.gpu,
        lane_move=_lane_move(winner.candidate, at=state.now, settings=settings),
        at=state.now,
        ranked=ranked,
        candidates=[head.candidate for head in heads.values()],
        resident_model=resident_model,
        settings=settings,
        previous_finished_at=state.previous_finished_at,
        attempt=winner.next_attempt,
        worker=worker,
        path=winner.path,
        gpu_slot=claim.gpu_slot,
        in_flight=claim.in_flight,
    )
    return claim


def _start_first_free(
    ranked: list[RankedCandidate],
    heads: dict[int, _Head],
    *,
    state: _GpuState,
    resident_model: str | None,
    worker: str,
    for_gateway: int | None,
    wait_for_lines: bool,
    sharing: str | None,
) -> tuple[ClaimedJob | None, list[RankedCandidate]]:
    """Mark the first of `ranked` that is free running; the claim and
    `ranked` with it first. None when a front-door claim's winner is not
    its gateway's.

    With several GPUs, claims made at the same instant rank the same jobs:
    the one whose row another GPU's claim holds is being started there, so
    this claim starts the next one at once, in its own transaction, rather
    than claim again later. With one GPU a held row is a cancel in progress,
    and the claim is made again (_LinesBusy), as it is when the member's
    lines are busy. `sharing`: the model whose jobs are in flight on the
    GPU; only its jobs may take the free slot."""
    for entry in ranked:
        winner = heads[entry.candidate.job_id]
        if sharing is not None and entry.candidate.model != sharing:
            return None, ranked  # a slot is only for the model in flight
        if for_gateway is not None and winner.gateway != for_gateway:
            return None, ranked
        if wait_for_lines:
            # The last try waits for the member's lines (queueapp/locks.py);
            # the others only try them.
            lock_member_lines(winner.candidate.member_id)
        elif state.gpu_count > 1 and not try_lock_member_lines(winner.candidate.member_id):
            # With several GPUs the member's running limit is checked in
            # the UPDATE, whose snapshot must follow the lines lock: another
            # GPU's claim of the member's job commits before it lets it go.
            raise _LinesBusy
        claim = _mark_running(
            winner,
            entry,
            state=state,
            resident_model=resident_model,
            worker=worker,
            wait=wait_for_lines,
        )
        if claim is not None:
            return claim, [entry, *(other for other in ranked if other is not entry)]
        if state.gpu_count <= 1:
            break
    raise _LinesBusy


def _lock_claims(gpu_id: int, *, wait: bool) -> bool:
    """The GPU's claim lock. The dispatcher waits for it; a front-door web
    process, or any claim made in a transaction that holds a job's row
    already, only tries it, and claims nothing when another claim holds it."""
    if wait:
        lock_gpu_claim(gpu_id)
        return True
    return try_lock_gpu_claim(gpu_id)


@dataclass(frozen=True)
class _GpuState:
    """What a claim reads of the database in its first statement: one row,
    its columns named as these fields (`_gpu_state` builds it by name)."""

    now: datetime
    # The GPU's row: enabled, the models it runs, the resident model recorded.
    name: str
    url: str
    enabled: bool
    served_models: list[str] | None
    allowed_models: list[str]
    resident_model: str
    min_band: int | None
    max_expected_seconds: float | None
    running_job_id: int | None  # one of them (a front-door job whose caller is gone first)
    running_lease_expires_at: datetime | None  # the earliest of their leases
    running_caller_gone: bool  # a front-door job whose web process died
    running_slots: list[int]
    running_model: str | None  # their model; None when two models are in flight
    running_model_parallel: int  # how many of its jobs the GPU may run at once
    previous_finished_at: datetime | None  # when the GPU last freed
    # Per member with running jobs: the GPUs they hold and their tier's limit.
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

    @property
    def running_count(self) -> int:
        return len(self.running_slots)

    def snapshot(self, *, resident_model: str | None) -> Snapshot:
        """The state as `decide` reads it, without heads (read next)."""
        gpu = self.gpu
        runs = gpu.runs_models(alone=self.gpu_count <= 1)
        short = None
        if gpu.max_expected_seconds is not None:
            short = frozenset(Durations.load().models_shorter_than(gpu.max_expected_seconds))
        limits = {row["member"]: row["limit"] for row in self.members_holding}
        return Snapshot(
            now=self.now.timestamp(),
            gpu=GpuSnapshot(
                name=gpu.name,
                resident_model=resident_model,
                runs_models=None if runs is None else frozenset(runs),
                min_band=gpu.min_band,
                short_models=short,
                slots_taken=frozenset(self.running_slots),
                in_flight_model=self.running_model,
                slots=self.running_model_parallel,
                enabled=gpu.enabled,
            ),
            heads=(),
            settings=policy_settings(self.policy),
            others=[
                GpuSnapshot(
                    name=other["name"],
                    resident_model=other["resident_model"] or None,
                    min_band=0 if other["reserved"] else None,
                    slots_taken=frozenset() if other["idle"] else frozenset({0}),
                    enabled=other["claiming"],
                )
                for other in self.other_gpus
            ],
            gpus_held={row["member"]: frozenset(row["gpus"]) for row in self.members_holding},
            running_limit=(lambda member: limits.get(member, 1)) if self.gpu_count > 1 else None,
            paused=self.policy.dispatch_paused,
        )

    def capped_members(self, snapshot: Snapshot) -> list[int]:
        """Members the running limit keeps off this GPU (`decide`'s rule),
        left out of the heads read by SQL."""
        if snapshot.running_limit is None:
            return []
        return [
            row["member"]
            for row in self.members_holding
            if at_running_limit(
                row["member"],
                gpu=snapshot.gpu.name,
                gpus_held=snapshot.gpus_held,
                limit=row["limit"],
            )
        ]

    def free_slot(self) -> int | None:
        return GpuSnapshot(
            name=self.name,
            slots_taken=frozenset(self.running_slots),
            in_flight_model=self.running_model,
            slots=self.running_model_parallel,
        ).free_slot()


_POLICY_COLUMNS = (
    "dispatch_paused",
    "aging_divisor",
    "swap_affinity_bonus",
    "band_spacing",
    "lease_seconds",
)
_GPU_COLUMNS = (
    "name",
    "url",
    "enabled",
    "served_models",
    "allowed_models",
    "resident_model",
    "min_band",
    "max_expected_seconds",
)


def _gpu_state(gpu_id: int) -> _GpuState:
    """The clock, the GPU, its running jobs, the members holding GPUs, the
    other GPUs and the policy, in one round trip."""
    with prepared_cursor() as cursor:
        cursor.execute(
            f"""
            SELECT now() AS now, gpu.name, gpu.url, gpu.enabled, gpu.served_models,
                   gpu.allowed_models, gpu.resident_model, gpu.min_band, gpu.max_expected_seconds,
                   running.id AS running_job_id,
                   running.lease_expires_at AS running_lease_expires_at,
                   running.caller_gone AS running_caller_gone,
                   running.slots AS running_slots, running.model AS running_model,
                   coalesce((SELECT setting.parallel FROM queueapp_modelsetting AS setting
                              WHERE setting.name = running.model), 1)
                       AS running_model_parallel,
                   previous.finished_at AS previous_finished_at,
                   holding.members AS members_holding, others.gpus AS other_gpus,
                   others.enabled AS gpu_count,
                   policy.id IS NOT NULL AS has_policy, policy.dispatch_paused,
                   policy.aging_divisor, policy.swap_affinity_bonus, policy.band_spacing,
                   policy.lease_seconds
              FROM queueapp_gpu AS gpu
              CROSS JOIN LATERAL (
                   -- Its running jobs: one, or several of one model sharing it.
                   SELECT coalesce(min(job.id) FILTER (WHERE job.gone), min(job.id)) AS id,
                          min(job.lease_expires_at) AS lease_expires_at,
                          coalesce(bool_or(job.gone), false) AS caller_gone,
                          CASE WHEN count(DISTINCT job.model) = 1 THEN min(job.model) END AS model,
                          coalesce(array_agg(job.gpu_slot), '{{}}') AS slots
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
                              'limit', held.max_running_jobs)), '[]') AS members
                     FROM (SELECT job.member_id, tier.max_running_jobs,
                                  array_agg(DISTINCT holder.name) AS gpus
                             FROM queueapp_job AS job
                             JOIN queueapp_gpu AS holder ON holder.id = job.gpu_id
                             JOIN queueapp_member AS member ON member.id = job.member_id
                             JOIN queueapp_tier AS tier ON tier.id = member.tier_id
                            WHERE job.status = 'running'
                            GROUP BY job.member_id, tier.max_running_jobs) AS held) AS holding
              CROSS JOIN LATERAL (
                   SELECT count(*) FILTER (WHERE other.enabled) AS enabled,
                          coalesce(json_agg(json_build_object(
                              'name', other.name, 'resident_model', other.resident_model,
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
            """,
            [gpu_id],
        )
        row = cursor.fetchone()
        names = [column.name for column in cursor.description]
    if row is None:
        raise Gpu.DoesNotExist(f"no GPU with id {gpu_id}")
    # By name: a column added, dropped or renamed fails here, at once.
    return _GpuState(gpu_id=gpu_id, **dict(zip(names, row, strict=True)))


@dataclass(frozen=True)
class _Head:
    candidate: Candidate
    path: str
    attempts: int
    front_door: bool
    gateway: int | None
    caller_gone: bool  # a front-door job whose web process died: never granted

    @property
    def next_attempt(self) -> int:
        return self.attempts + 1


_BEST_HEADS = """
    SELECT id{rank} FROM queueapp_job
     WHERE status = 'queued' AND is_lane_head AND {model}
       AND member_id <> ALL(%(capped)s)
       AND (NOT %(reserved)s OR priority >= %(min_band)s OR model = ANY(%(short)s))
     ORDER BY rank_key DESC, id LIMIT %(limit)s
"""
# A reservation without a band floor admits no band by it.
_NO_BAND = 2**31 - 1


def _candidates(
    *,
    runs_models: frozenset[str] | None,
    resident_model: str | None,
    capped_members: list[int],
    gpu: Gpu,
    short_models: frozenset[str] | None,
) -> dict[int, _Head]:
    """The best line heads by key among the models the GPU runs (all, when
    `runs_models` is None), and those of the resident model (the affinity
    bonus may lift one above the first), leaving out the jobs of members at
    their running limit and those the GPU's reservation keeps out. More than
    the winner needs, so the counterfactuals (who wins without a term) have
    a pool to choose from. Not locked: the winner's row is, when it is
    marked running."""
    if resident_model and runs_models is not None and resident_model not in runs_models:
        resident_model = None
    if runs_models is None:
        wanted = f"({_BEST_HEADS.format(rank='', model='true')})"
    else:
        # One index scan per model (`job_queued_model_rank`), however rare.
        per_model = _BEST_HEADS.format(rank=", rank_key", model="model = runs.model")
        wanted = f"""(
            SELECT best.id FROM unnest(%(runs)s::varchar[]) AS runs(model)
             CROSS JOIN LATERAL ({per_model}) AS best
             ORDER BY best.rank_key DESC, best.id LIMIT %(limit)s)
        """
    if resident_model:
        wanted += f" UNION ALL ({_BEST_HEADS.format(rank='', model='model = %(model)s')})"
    with prepared_cursor() as cursor:
        cursor.execute(
            f"""
            SELECT job.id, job.priority, tier.bonus, job.model, job.submitted_at,
                   job.eligible_at, job.member_id, job.path, job.attempts, job.front_door,
                   job.gateway,
                   job.gateway IS NOT NULL AND NOT job.gateway = ANY(live.id) AND {JUDGING_SQL}
              FROM queueapp_job AS job
              CROSS JOIN LATERAL (SELECT coalesce(array_agg(objid), '{{}}') AS id
                                    FROM ({LIVE_GATEWAYS_SQL}) AS alive(objid)) AS live
              JOIN queueapp_member AS member ON member.id = job.member_id
              JOIN queueapp_tier AS tier ON tier.id = member.tier_id
             WHERE job.id IN ({wanted}) AND job.status = 'queued' AND job.is_lane_head
            """,
            {
                "limit": CANDIDATE_POOL,
                "model": resident_model,
                "runs": None if runs_models is None else sorted(runs_models),
                "capped": capped_members,
                "reserved": gpu.reserved,
                "min_band": _NO_BAND if gpu.min_band is None else gpu.min_band,
                "short": sorted(short_models or ()),
            },
        )
        rows = cursor.fetchall()
    return {
        job_id: _Head(
            Candidate(
                job_id=job_id,
                band=band,
                tier_bonus=bonus,
                model=model,
                submitted_at=submitted_at.timestamp(),
                eligible_at=eligible_at.timestamp(),
                member_id=member_id,
            ),
            path=path,
            attempts=attempts,
            front_door=front_door,
            gateway=gateway,
            caller_gone=caller_gone,
        )
        for (
            job_id,
            band,
            bonus,
            model,
            submitted_at,
            eligible_at,
            member_id,
            path,
            attempts,
            front_door,
            gateway,
            caller_gone,
        ) in rows
    }


def _busy(state: _GpuState, running_job_id: int, *, draining: bool = False) -> GpuBusy:
    """A running job, and how long until it is worth looking again."""
    expires = state.running_lease_expires_at or state.now  # a running job has a lease
    left = (expires - state.now).total_seconds()
    return GpuBusy(
        running_job_id,
        seconds_left=min(max(left, 0.0), BUSY_RECHECK_SECONDS),
        caller_gone=state.running_caller_gone,
        draining=draining,
    )


def _mark_running(
    winner: _Head,
    ranked_first: RankedCandidate,
    *,
    state: _GpuState,
    resident_model: str | None,
    worker: str,
    wait: bool,
) -> ClaimedJob | None:
    """The winner running on the GPU under a new lease, in one UPDATE that
    locks its row (waiting only on the last try: another GPU's claim or a
    cancel may hold it) and tries the member's lines lock: the dispatch
    moves the member's line on (lane_dispatched_sql), so it must not
    overlap a change to the member's lines. With several GPUs it also
    checks the member's running limit. None when the row or the lines are
    held, or the limit is reached meanwhile."""
    chosen = ranked_first.candidate
    terms = ranked_first.terms.as_dict()
    token = f"{worker}/{uuid.uuid4().hex[:12]}"
    lease_seconds = state.policy.lease_seconds
    with prepared_cursor() as cursor:
        params: dict[str, Any] = {  # Jsonb: django-stubs knows only plain values
            "now": state.now,
            "expires": state.now + timedelta(seconds=lease_seconds),
            "token": token,
            "attempt": winner.next_attempt,
            "terms": Jsonb(terms),
            "gpu": state.gpu.pk,
            "slot": state.free_slot(),
            "job": chosen.job_id,
            "lines": MEMBER_LINES_LOCK,  # true at once when already held
            # One GPU: the limit counts GPUs held, so it cannot bind.
            "check_limit": state.gpu_count > 1,
        }
        cursor.execute(
            f"""
            UPDATE queueapp_job AS job
               SET status = 'running', is_lane_head = false, started_at = %(now)s,
                   lease_expires_at = %(expires)s, lease_owner = %(token)s,
                   attempts = %(attempt)s, score_at_dispatch = %(terms)s,
                   gpu_id = %(gpu)s, gpu_slot = %(slot)s
             WHERE job.id = (SELECT id FROM queueapp_job
                              WHERE id = %(job)s AND status = 'queued' AND is_lane_head
                                FOR UPDATE {"" if wait else "SKIP LOCKED"})
               AND pg_try_advisory_xact_lock(%(lines)s, job.member_id::integer)
               AND (NOT %(check_limit)s OR (
                    SELECT count(DISTINCT running.gpu_id) FROM queueapp_job AS running
                     WHERE running.member_id = job.member_id AND running.status = 'running'
                       AND running.gpu_id <> %(gpu)s)
                    < (SELECT tier.max_running_jobs FROM queueapp_member AS member
                         JOIN queueapp_tier AS tier ON tier.id = member.tier_id
                        WHERE member.id = job.member_id))
         RETURNING body, coalesce((SELECT setting.parallel FROM queueapp_modelsetting AS setting
                                    WHERE setting.name = job.model), 1)
            """,
            params,
        )
        updated = cursor.fetchone()
        if updated is None:
            return None
        # Decoded as the ORM would (Django leaves jsonb undecoded in raw rows).
        body_field = Job._meta.get_field("body")
        body = body_field.from_db_value(updated[0], None, connection)  # type: ignore[arg-type]  # JSONField ignores the expression
        parallel = updated[1]
    return ClaimedJob(
        job_id=chosen.job_id,
        path=winner.path,
        body=body,
        model=chosen.model,
        claim_token=token,
        lease_seconds=lease_seconds,
        swap_needed=chosen.model != resident_model,
        granted=winner.front_door,
        effective_score=terms["effective"],
        gpu_id=state.gpu.pk,
        upstream_url=state.gpu.url,
        gpu_slot=state.free_slot() or 0,
        in_flight=state.running_count + 1,
        shared=parallel > 1,
    )


def _lane_move(
    chosen: Candidate, *, at: datetime, settings: PolicySettings
) -> tuple[str, dict[str, Any]]:
    """Fair share: the member's other jobs in this band age from now; written
    in the decision's statement."""
    return lane_dispatched_sql(
        member_id=chosen.member_id,
        band=chosen.band,
        model=chosen.model,
        at=at,
        key=rank_key(
            band=chosen.band,
            tier_bonus=chosen.tier_bonus,
            eligible_at=at.timestamp(),
            aging_divisor=settings.aging_divisor,
        ),
    )
