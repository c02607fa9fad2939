"""The claim: which queued job takes the GPU next, and marking it running.

`job_claim_next` is one short transaction of named steps:

1. take the GPU claim lock (queueapp/locks.py);
2. read the GPU's state: the clock, the running job, the policy;
3. if a job runs, the GPU is busy: say until when;
4. lock the candidates: the best line heads by rank key, and those of the
   resident model;
5. rank them (`queueapp.policy.rank`: the decision itself);
6. mark the winner running, under a lease;
7. move its lane on (queueapp/lanes.py: fair share inside a band) and
   record the decision and the job's `started` event (decisions.py), in
   one statement.

Each step is one plain-SQL statement: the claim sits between two GPU jobs,
so every round trip and every ORM object counts (docs/benchmarks.md). What
happens to a running job afterwards (lease renewal, finish, return to the
queue, recovery when its dispatcher died) is in lease.py.

None of it is ever open while the job's body travels to llama-swap. The
claim lock serialises "is the GPU free?" between two dispatchers (a
re-delivered django-q2 task, a second cluster started by mistake), and a
partial unique index (one running job per GPU slot) makes a second running
job impossible even if that lock were bypassed.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connection, transaction
from psycopg.types.json import Jsonb

from queueapp.dispatch.decisions import LEADING_CANDIDATES, decision_record
from queueapp.gateways import JUDGING_SQL, LIVE_GATEWAYS_SQL, gateway_gone_sql
from queueapp.lanes import lane_dispatched_sql
from queueapp.locks import (
    MEMBER_LINES_LOCK,
    lock_gpu_claims,
    lock_member_lines,
    try_lock_gpu_claims,
)
from queueapp.models import Job, Policy
from queueapp.policy import Candidate, PolicySettings, RankedCandidate, rank, rank_key
from queueapp.prepared import prepared_cursor
from queueapp.selectors import policy_settings
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
        )


@dataclass(frozen=True)
class GpuBusy:
    """Another dispatcher's job holds the GPU until its lease expires."""

    job_id: int
    seconds_left: float  # until its lease expires, bounded to a short re-check
    # A front-door job whose caller's web process died: nobody will use or
    # end it, so it is failed now rather than at lease expiry.
    caller_gone: bool = False


@dataclass(frozen=True)
class CallersGone:
    """The only queued heads are front-door jobs whose web process died: cancel
    them (services.front_door_orphans_cancel) and claim again."""

    job_ids: list[int]


class _LinesBusy(Exception):
    """The chosen job's member is changing its lines (a submission, a cancel)."""


# The change holding the lines lock is one short transaction.
LINES_BUSY_RETRY_SECONDS = 0.005
LINES_BUSY_MAX_TRIES = 200


def job_claim_next(
    *, resident_model: str | None, worker: str
) -> ClaimedJob | GpuBusy | CallersGone | None:
    """Mark the best queued job running and record why; None when nothing to do."""
    for _ in range(LINES_BUSY_MAX_TRIES - 1):
        try:
            return _claim_next(resident_model=resident_model, worker=worker)
        except _LinesBusy:
            time.sleep(LINES_BUSY_RETRY_SECONDS)
    return _claim_next(resident_model=resident_model, worker=worker, wait_for_lines=True)


def gateway_claim(*, gateway: int, worker: str) -> ClaimedJob | None:
    """The same claim, made by a front-door web process for its own waiting
    callers (no hop through the dispatcher), inside the caller's transaction:
    the one that queued a call's job, or the one that ended the last.

    It never waits for a lock: it only tries the GPU claim lock, so taking
    it after the member's lines lock or a job's row (queueapp/locks.py)
    cannot deadlock. It scores swap affinity by the resident model the
    dispatcher last recorded, and grants only when the winner is one of
    that gateway's jobs: whoever the score picks, the dispatcher would grant
    the same job. None, with nothing written, when the GPU is busy, the
    dispatcher is claiming, or another job wins.
    """
    assert connection.in_atomic_block, "gateway_claim runs inside the caller's transaction"
    try:
        outcome = _claim_steps(resident_model=None, worker=worker, for_gateway=gateway)
    except _LinesBusy:
        return None
    return outcome if isinstance(outcome, ClaimedJob) else None


def _claim_next(
    *, resident_model: str | None, worker: str, wait_for_lines: bool = False
) -> ClaimedJob | GpuBusy | CallersGone | None:
    with transaction.atomic(durable=True):
        return _claim_steps(
            resident_model=resident_model,
            worker=worker,
            for_gateway=None,
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
    return job, gateway_claim(gateway=gateway, worker=worker) if claim else None


def _claim_steps(
    *,
    resident_model: str | None,
    worker: str,
    for_gateway: int | None,
    wait_for_lines: bool = False,
) -> ClaimedJob | GpuBusy | CallersGone | None:
    """The claim's steps, in the caller's transaction."""
    if not _lock_claims(for_gateway=for_gateway):
        return None  # the dispatcher is claiming: it grants the best job
    state = _gpu_state()
    if state.running_job_id is not None:
        return _busy(state, state.running_job_id)
    if state.policy.dispatch_paused:
        return None
    if for_gateway is not None:
        resident_model = state.recorded_resident_model
    settings = policy_settings(state.policy)
    all_heads = _lock_candidates(resident_model)
    # A caller whose web process died is never granted the GPU.
    heads = {job_id: head for job_id, head in all_heads.items() if not head.caller_gone}
    if not heads:
        return CallersGone(sorted(all_heads)) if all_heads else None
    ranked = rank(
        (head.candidate for head in heads.values()),
        now=state.now.timestamp(),
        resident_model=resident_model,
        settings=settings,
        top=LEADING_CANDIDATES,
    )
    winner = heads[ranked[0].candidate.job_id]
    if for_gateway is not None and winner.gateway != for_gateway:
        return None  # the dispatcher grants it; nothing is written here
    if wait_for_lines:
        # The last try waits for the member's lines (queueapp/locks.py);
        # the others only try them in _mark_running.
        lock_member_lines(winner.candidate.member_id)
    claim = _mark_running(
        winner, ranked[0], state=state, resident_model=resident_model, worker=worker
    )
    decision_record(
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
    )
    return claim


def _lock_claims(*, for_gateway: int | None) -> bool:
    """The GPU claim lock. The dispatcher waits for it; a front-door web
    process only tries it, and claims nothing when the dispatcher holds it."""
    if for_gateway is None:
        lock_gpu_claims()
        return True
    return try_lock_gpu_claims()


@dataclass(frozen=True)
class _GpuState:
    now: datetime
    running_job_id: int | None
    running_lease_expires_at: datetime | None
    running_caller_gone: bool  # a front-door job whose web process died
    previous_finished_at: datetime | None  # when the GPU last freed
    recorded_resident_model: str | None  # as the dispatcher last saw at llama-swap
    policy: Policy


_POLICY_COLUMNS = ("aging_divisor", "swap_affinity_bonus", "band_spacing", "lease_seconds")


def _gpu_state() -> _GpuState:
    """The clock, the running job and the policy, in one round trip."""
    with prepared_cursor() as cursor:
        cursor.execute(
            f"""
            SELECT now(), running.id, running.lease_expires_at,
                   {gateway_gone_sql("running.gateway")},
                   previous.finished_at, upstream.resident_model,
                   policy.id IS NOT NULL, policy.dispatch_paused, policy.aging_divisor,
                   policy.swap_affinity_bonus, policy.band_spacing, policy.lease_seconds
              FROM (SELECT 1) AS one
              LEFT JOIN LATERAL (
                   SELECT id, lease_expires_at, gateway FROM queueapp_job
                    WHERE status = 'running' AND gpu_slot = 0 LIMIT 1) AS running ON true
              LEFT JOIN LATERAL (
                   SELECT job.finished_at FROM queueapp_dispatchdecision AS decision
                     JOIN queueapp_job AS job ON job.id = decision.job_id
                    ORDER BY decision.id DESC LIMIT 1) AS previous ON true
              LEFT JOIN queueapp_upstreamstate AS upstream ON upstream.id = 1
              LEFT JOIN queueapp_policy AS policy ON policy.id = 1
            """
        )
        (
            now,
            running_id,
            lease_expires_at,
            caller_gone,
            previous_finished_at,
            recorded_resident,
            has_policy,
            paused,
            *values,
        ) = cursor.fetchone()
    policy = Policy(pk=1)  # the defaults, until an operator saves a policy
    if has_policy:
        policy.dispatch_paused = paused
        for column, value in zip(_POLICY_COLUMNS, values, strict=True):
            setattr(policy, column, value)
    return _GpuState(
        now=now,
        running_job_id=running_id,
        running_lease_expires_at=lease_expires_at,
        running_caller_gone=bool(caller_gone),
        previous_finished_at=previous_finished_at,
        recorded_resident_model=recorded_resident or None,
        policy=policy,
    )


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


def _lock_candidates(resident_model: str | None) -> dict[int, _Head]:
    """The best line heads by key, and those of the resident model (the
    affinity bonus may lift one above the first), locked; skips rows another
    transaction holds (a cancel in progress). More than the winner needs, so
    the counterfactuals (who wins without a term) have a pool to choose from."""
    best_heads = """
        SELECT id FROM queueapp_job
         WHERE status = 'queued' AND is_lane_head {model}
         ORDER BY rank_key DESC, id LIMIT %(limit)s
    """
    wanted = f"({best_heads.format(model='')})"
    if resident_model:
        wanted += f" UNION ALL ({best_heads.format(model='AND model = %(model)s')})"
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
               FOR UPDATE OF job SKIP LOCKED
            """,
            {"limit": CANDIDATE_POOL, "model": resident_model},
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


def _busy(state: _GpuState, running_job_id: int) -> GpuBusy:
    """The running job, and how long until it is worth looking again."""
    expires = state.running_lease_expires_at or state.now  # a running job has a lease
    left = (expires - state.now).total_seconds()
    return GpuBusy(
        running_job_id,
        seconds_left=min(max(left, 0.0), BUSY_RECHECK_SECONDS),
        caller_gone=state.running_caller_gone,
    )


def _mark_running(
    winner: _Head,
    ranked_first: RankedCandidate,
    *,
    state: _GpuState,
    resident_model: str | None,
    worker: str,
) -> ClaimedJob:
    """The winner running under a new lease, in one UPDATE that also tries
    the member's lines lock: the dispatch moves the member's line on
    (lane_dispatched_sql), so it must not overlap a change to the member's lines.
    Raises _LinesBusy when a submission or a cancel holds them."""
    chosen = ranked_first.candidate
    terms = ranked_first.terms.as_dict()
    token = f"{worker}/{uuid.uuid4().hex[:12]}"
    lease_seconds = state.policy.lease_seconds
    with prepared_cursor() as cursor:
        params: list[Any] = [  # Jsonb: django-stubs knows only plain values
            state.now,
            state.now + timedelta(seconds=lease_seconds),
            token,
            winner.next_attempt,
            Jsonb(terms),
            chosen.job_id,
            MEMBER_LINES_LOCK,  # true at once when already held (last try)
        ]
        cursor.execute(
            """
            UPDATE queueapp_job
               SET status = 'running', is_lane_head = false, started_at = %s,
                   lease_expires_at = %s, lease_owner = %s, attempts = %s,
                   score_at_dispatch = %s
             WHERE id = %s AND pg_try_advisory_xact_lock(%s, member_id::integer)
         RETURNING body
            """,
            params,
        )
        updated = cursor.fetchone()
        if updated is None:
            raise _LinesBusy
        # Decoded as the ORM would (Django leaves jsonb undecoded in raw rows).
        body_field = Job._meta.get_field("body")
        body = body_field.from_db_value(updated[0], None, connection)  # type: ignore[arg-type]  # JSONField ignores the expression
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
