"""The claim: which queued job takes a GPU next, and marking it running.

`job_claim_next` is one short transaction for one GPU (Kueue's snapshot,
nominate, admit):

1. take the GPU's claim lock (queueapp/locks.py: claims for different GPUs
   run at once);
2. snapshot: read what the decision needs (snapshot.py), by column name;
3. decide: `queueapp.policy.decide` holds every rule (slots, the drain,
   served models, the reservation, the running limit, placement), the
   same function the forecast and the policy simulator call;
4. apply: start the winner in one statement (queueapp/transitions.py),
   then record the decision, the lane's move and the job's `started`
   event in one more (decisions.py).

It answers what happened (outcomes.py), never a bare None. The same steps
run inside another transaction for a front-door web process
(`gateway_claim`) and for the end of a job (`claim_in_end_transaction`), where
every lock is only tried.

None of it is ever open while the job's body travels to llama-swap. The
GPU's claim lock serialises "is the GPU free?" between two dispatchers of
it (a re-delivered django-q2 task, a second cluster started by mistake),
and a partial unique index (one running job per GPU slot) makes a second
running job impossible even if that lock were bypassed. What happens to a
running job afterwards is in lease.py.

Several GPUs claim at once (each takes the queue-wide claim lock shared);
two of them may rank the same jobs. The one that finds the winner's row
held starts the next of its ranking in the same transaction
(`_start_first_free`): retrying the whole claim a moment later instead made
GPUs freed together take turns. With several GPUs the member's running
limit is counted in the statement that starts the job, after the member's
lines lock, so two GPUs cannot each start a job of a member at the limit.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, replace
from typing import Any

from django.db import connection, transaction

from queueapp import transitions
from queueapp.dispatch.claim_modes import (
    ByDispatcher,
    ClaimMode,
    ForGateway,
    InEndTransaction,
    resident_model_of,
)
from queueapp.dispatch.decisions import LEADING_CANDIDATES, decision_record, gpu_idle_record
from queueapp.dispatch.outcomes import (
    CallersGone,
    ClaimedJob,
    ClaimOutcome,
    GpuBusy,
    HeadsOverdue,
    NoClaim,
    Unclaimed,
)
from queueapp.dispatch.room import gpus_with_room_for
from queueapp.dispatch.snapshot import (
    GpuState,
    Head,
    gpu_state_read,
    heads_read,
)
from queueapp.lanes import lane_dispatched_sql
from queueapp.locks import (
    lock_gpu_claim,
    lock_member_lines,
    try_lock_gpu_claim,
    try_lock_member_lines,
)
from queueapp.policy import RankedCandidate
from queueapp.policy.decide import (
    Decision,
    GpuSnapshot,
    HeadFilter,
    Outcome,
    Skip,
    Snapshot,
    decide,
    prefilter,
)
from queueapp.policy.score import is_loaded
from queueapp.policy.skip_record import skip_record
from queueapp.services.gpus import gpu_configured
from queueapp.transitions import NotStarted

# Longest wait before looking again at a job another dispatcher runs.
BUSY_RECHECK_SECONDS = 5.0

# The change holding the lines lock is one short transaction.
LINES_BUSY_RETRY_SECONDS = 0.005
LINES_BUSY_MAX_TRIES = 200


def job_claim_next(
    *, resident_model: str | None, worker: str, gpu: int | None = None
) -> ClaimOutcome:
    """Mark the best queued job that GPU `gpu` (an id; None: this process's
    configured GPU) can run running on it, and record why; otherwise say
    why not (the GPU is busy, the only heads' callers are gone, `NoClaim`).
    When the winner's row or its member's lines are held, it claims again:
    the change holding them is one short transaction; the last try waits."""
    gpu_id = gpu if gpu is not None else gpu_configured().pk
    outcome: ClaimOutcome = NoClaim(Unclaimed.HELD, "not tried")
    for attempt in range(LINES_BUSY_MAX_TRIES):
        mode = ByDispatcher(resident_model, wait_for_lines=attempt == LINES_BUSY_MAX_TRIES - 1)
        with transaction.atomic(durable=True):
            outcome = _claim_steps(mode, worker=worker, gpu_id=gpu_id)
        if not (isinstance(outcome, NoClaim) and outcome.kind is Unclaimed.HELD):
            return outcome
        time.sleep(LINES_BUSY_RETRY_SECONDS)
    return outcome


def gateway_claim(
    *, gateway: int, worker: str, gpu: int | None = None, model: str | None = None
) -> ClaimOutcome:
    """The same claim, made by a front-door web process for its own waiting
    callers (no hop through the dispatcher), inside the caller's transaction:
    the one that queued a call's job (`model` its model: the GPUs that could
    start it now are tried, the one with it loaded first), or the one that
    ended the last on GPU `gpu`.

    It never waits for a lock: it only tries the GPU's claim lock and the
    winner's row, so taking them after the member's lines lock or a job's
    row (queueapp/locks.py) cannot deadlock. It scores swap affinity by the
    resident model the dispatcher last recorded, and grants only when the
    winner is one of that gateway's jobs: whoever the score picks, the
    dispatcher would grant the same job. Nothing is written unless a job
    is claimed: the GPU is busy, its dispatcher is claiming, or another job
    wins (the last GPU tried says which).
    """
    assert connection.in_atomic_block, "gateway_claim runs inside the caller's transaction"
    gpu_ids = [gpu] if gpu is not None else gpus_with_room_for(model or "")
    outcome: ClaimOutcome = NoClaim(Unclaimed.NOTHING, f"no GPU has room for {model}")
    for gpu_id in gpu_ids:
        outcome = _claim_steps(ForGateway(gateway), worker=worker, gpu_id=gpu_id)
        if isinstance(outcome, ClaimedJob):
            break
    return outcome


def claim_in_end_transaction(*, gpu: int, resident_model: str | None, worker: str) -> ClaimOutcome:
    """The dispatcher's claim of GPU `gpu`'s next job, inside the
    transaction that ended its last (`lease.job_end_and_claim_next`): one
    commit fewer between two jobs of a backlog. It holds the ended job's
    row, so it only tries its locks (queueapp/locks.py); nothing is
    written when a lock is held, the GPU is taken, or nothing waits: the
    dispatcher then claims as usual."""
    assert connection.in_atomic_block, "claim_in_end_transaction runs inside the end's transaction"
    return _claim_steps(InEndTransaction(resident_model), worker=worker, gpu_id=gpu)


def _claim_steps(mode: ClaimMode, *, worker: str, gpu_id: int) -> ClaimOutcome:
    """The claim's steps for GPU `gpu_id`, in the caller's transaction:
    snapshot, `decide`, apply."""
    if not _lock_claims(gpu_id, wait=mode.waits):
        return NoClaim(Unclaimed.CLAIMING, "another claim of this GPU is under way")
    state = gpu_state_read(gpu_id)
    snapshot = state.snapshot(
        resident_model=resident_model_of(mode, recorded=state.gpu.resident_model)
    )
    closed = snapshot.closed()
    if state.running_job_id is not None and (closed is Outcome.FULL or state.running_caller_gone):
        return _busy(state, state.running_job_id)
    if closed is not None:
        return NoClaim(Unclaimed.STOPPED, "dispatch is paused or the GPU is disabled")
    decided = heads_decided(state, snapshot)
    decision = decided.decision
    if decision.outcome is Outcome.NOTHING:
        if decided.callers_gone:
            return CallersGone(decided.callers_gone)
        if decision.skipped_for(Skip.OVERDUE):
            # Past their wait bound (decide's rule): expired, then claimed again.
            return HeadsOverdue(sorted(decision.skipped_for(Skip.OVERDUE)))
        if isinstance(mode, ByDispatcher) and snapshot.gpu.idle:
            # The dispatcher's own pass keeps why its GPU stands idle.
            gpu_idle_record(gpu_id=gpu_id, at=state.now, skips=decided.skips(state))
        return NoClaim(Unclaimed.NOTHING, decision.reason)
    if decision.outcome in (Outcome.DRAIN, Outcome.FULL):
        # A better job of another model waits for this GPU: it drains, and
        # its model gets no new slot, or a stream of its jobs would hold
        # the swap off for ever. FULL: with resident sets, every head waits
        # for a slot of its own model.
        assert state.running_job_id is not None  # jobs are in flight
        draining = decision.outcome is Outcome.DRAIN
        return _busy(
            state,
            state.running_job_id,
            draining=draining,
            wake_on_work=draining and decided.gpu.beside is not None,
        )
    started = _start_first_free(decided, mode, state=state, worker=worker)
    if isinstance(started, NoClaim):
        return started  # the dispatcher grants it; nothing is written here
    claim, ranked = started
    _record(claim, ranked, decided, state=state, worker=worker)
    return claim


@dataclass(frozen=True)
class Decided:
    """The heads the claim read (`wanted`: the pre-filter as first applied),
    but those whose caller's web process died (`callers_gone`: never
    granted), and `decide` over them."""

    heads: dict[int, Head]
    decision: Decision
    wanted: HeadFilter
    callers_gone: list[int]
    gpu: GpuSnapshot  # the GPU it decided for

    def skips(self, state: GpuState) -> dict[str, Any]:
        """Why the heads passed over did not start, as kept (skip_record.py)."""
        return skip_record(
            self.decision,
            self.wanted,
            candidates_member={
                job_id: head.candidate.member_id for job_id, head in self.heads.items()
            },
            holding=state.holdings(),
        )


def heads_decided(state: GpuState, snapshot: Snapshot) -> Decided:
    """The heads read by `decide`'s pre-filter, and `decide` over them.
    When nothing else may take the GPU, the heads are read again with those
    of the members at their running limit who may borrow it
    (decide.Borrowing): the pre-filter left them out."""
    wanted = prefilter(snapshot)
    decided = _heads_and_decision(state, snapshot, wanted)
    if decided.decision.outcome is Outcome.NOTHING and wanted.may_borrow:
        again = _heads_and_decision(state, snapshot, wanted.with_borrowers())
        decided = replace(again, wanted=wanted)
    return decided


def _heads_and_decision(state: GpuState, snapshot: Snapshot, wanted: HeadFilter) -> Decided:
    every_head = heads_read(wanted)
    heads = {job_id: head for job_id, head in every_head.items() if not head.caller_gone}
    decision = decide(
        replace(snapshot, heads=[head.candidate for head in heads.values()]),
        # Terms for as many as claims at the same instant may need to skip.
        top=max(LEADING_CANDIDATES, state.gpu_count),
    )
    gone = sorted(job_id for job_id in every_head if job_id not in heads)
    return Decided(heads, decision, wanted, callers_gone=gone, gpu=snapshot.gpu)


def _record(
    claim: ClaimedJob,
    ranked: list[RankedCandidate],
    decided: Decided,
    *,
    state: GpuState,
    worker: str,
) -> None:
    """The decision's row, the lane's move and the job's `started` event,
    in one statement (decisions.py)."""
    heads, decision = decided.heads, decided.decision
    winner = heads[claim.job_id]
    settings = state.settings
    decision_record(
        gpu=state.gpu,
        # Fair share: the member's other jobs in this band age from now.
        lane_move=lane_dispatched_sql(
            member_id=winner.candidate.member_id,
            band=winner.candidate.band,
            model=winner.candidate.model,
            at=state.now,
            tier_bonus=winner.candidate.tier_bonus,
            aging_divisor=settings.aging_divisor,
        ),
        at=state.now,
        ranked=ranked,
        candidates=[head.candidate for head in heads.values()],
        resident_model=decision.affinity_model,
        loaded=decision.loaded,
        settings=settings,
        previous_finished_at=state.previous_finished_at,
        attempt=winner.next_attempt,
        worker=worker,
        path=winner.path,
        gpu_slot=claim.gpu_slot,
        in_flight=claim.in_flight,
        borrowed=decision.borrowed,
        swap=decided.gpu.predicted_swap(winner.candidate.model),
        skips=decided.skips(state),
    )


def _start_first_free(
    decided: Decided, mode: ClaimMode, *, state: GpuState, worker: str
) -> tuple[ClaimedJob, list[RankedCandidate]] | NoClaim:
    """Start the first of the decision's startable heads that is free; the
    claim and the ranking with it first.

    With several GPUs, claims made at the same instant rank the same jobs:
    the one whose row another GPU's claim holds is being started there, so
    this claim starts the next one at once, in its own transaction, rather
    than claim again later. With one GPU a held row is a cancel in progress:
    the claim says so (`Unclaimed.HELD`), and the dispatcher claims again,
    as it does when the member's lines are busy."""
    decision = decided.decision
    ranked = list(decision.ranked)
    several = not state.facts.alone
    for entry in decision.startable:
        winner = decided.heads[entry.candidate.job_id]
        if isinstance(mode, ForGateway) and winner.gateway != mode.gateway:
            return NoClaim(Unclaimed.ANOTHER_JOB, "the winner is not this web process's caller")
        if mode.wait_for_lines:
            # The last try waits for the member's lines (queueapp/locks.py);
            # the others only try them.
            lock_member_lines(winner.candidate.member_id)
        elif several and not try_lock_member_lines(winner.candidate.member_id):
            # With several GPUs the member's running limit is checked in
            # the UPDATE, whose snapshot must follow the lines lock: another
            # GPU's claim of the member's job commits before it lets it go.
            return _held(NotStarted.LINES_BUSY)
        started = _start(
            winner,
            entry,
            decision,
            state=state,
            worker=worker,
            mode=mode,
            gpu=decided.gpu,
        )
        if isinstance(started, ClaimedJob):
            return started, [entry, *(other for other in ranked if other is not entry)]
        if not several:
            return _held(started)
    if len(decision.startable) < len(ranked):
        # The next best is of another model: the slot stays free for now.
        return NoClaim(Unclaimed.ANOTHER_JOB, "a free slot is only for the model in flight")
    return _held(NotStarted.HELD)


def _held(why: NotStarted) -> NoClaim:
    """Nothing started and nothing written: the winner, or its member's
    lines, were being changed by another transaction (`why`)."""
    return NoClaim(Unclaimed.HELD, f"the winner could not start now: {why.value}")


def _start(
    winner: Head,
    ranked_entry: RankedCandidate,
    decision: Decision,
    *,
    state: GpuState,
    worker: str,
    mode: ClaimMode,
    gpu: GpuSnapshot,
) -> ClaimedJob | NotStarted:
    """The winner running on `gpu` in the decision's slot
    (transitions.start), as a claim; otherwise what stopped it. With
    resident sets, jobs of other models may start beside it, so it runs in
    a shared slot like a model with `parallel` > 1."""
    chosen = ranked_entry.candidate
    terms = ranked_entry.terms.as_dict()
    swap = gpu.predicted_swap(chosen.model)
    token = f"{worker}/{uuid.uuid4().hex[:12]}"
    assert decision.slot is not None  # a START
    started = transitions.start(
        job_id=chosen.job_id,
        gpu_id=state.gpu_id,
        slot=decision.slot,
        now=state.now,
        lease_seconds=state.policy.lease_seconds,
        token=token,
        attempt=winner.next_attempt,
        terms=terms,
        wait=mode.wait_for_lines,
        # Alone: the limit counts GPUs held, so it cannot bind. A borrowed
        # GPU is lent past it.
        check_limit=state.facts.running_limit is not None and not decision.borrowed,
        swap=None if swap is None else swap.as_json(),
    )
    if isinstance(started, NotStarted):
        return started
    return ClaimedJob(
        job_id=chosen.job_id,
        path=winner.path,
        body=started.body,
        model=chosen.model,
        claim_token=token,
        lease_seconds=state.policy.lease_seconds,
        swap_needed=not is_loaded(chosen.model, decision.loaded),
        granted=winner.front_door,
        effective_score=terms["effective"],
        gpu_id=state.gpu_id,
        upstream_url=state.url,
        gpu_slot=decision.slot,
        in_flight=decision.in_flight + 1,
        shared=started.parallel > 1 or gpu.beside is not None,
    )


def _lock_claims(gpu_id: int, *, wait: bool) -> bool:
    """The GPU's claim lock. The dispatcher waits for it; a front-door web
    process, or any claim made in a transaction that holds a job's row
    already, only tries it, and claims nothing when another claim holds it."""
    if wait:
        lock_gpu_claim(gpu_id)
        return True
    return try_lock_gpu_claim(gpu_id)


def _busy(
    state: GpuState, running_job_id: int, *, draining: bool = False, wake_on_work: bool = False
) -> GpuBusy:
    """A running job, and how long until it is worth looking again."""
    expires = state.running_lease_expires_at or state.now  # a running job has a lease
    left = (expires - state.now).total_seconds()
    return GpuBusy(
        running_job_id,
        seconds_left=min(max(left, 0.0), BUSY_RECHECK_SECONDS),
        caller_gone=state.running_caller_gone,
        draining=draining,
        wake_on_work=wake_on_work,
    )
