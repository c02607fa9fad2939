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
from dataclasses import replace

from django.db import connection, transaction

from queueapp import transitions
from queueapp.dispatch.decisions import LEADING_CANDIDATES, decision_record
from queueapp.dispatch.outcomes import (
    CallersGone,
    ClaimedJob,
    ClaimOutcome,
    GpuBusy,
    HeadsOverdue,
    NoClaim,
    Unclaimed,
)
from queueapp.dispatch.snapshot import GpuState, Head, gpu_state_read, idle_gpus_running
from queueapp.lanes import lane_dispatched_sql
from queueapp.locks import (
    lock_gpu_claim,
    lock_member_lines,
    try_lock_gpu_claim,
    try_lock_member_lines,
)
from queueapp.policy import RankedCandidate
from queueapp.policy.decide import Decision, Outcome, Skip, Snapshot, decide
from queueapp.services.gpus import gpu_configured

# Longest wait before looking again at a job another dispatcher runs.
BUSY_RECHECK_SECONDS = 5.0


class _LinesBusy(Exception):
    """The chosen job is held: its member is changing its lines (a
    submission, a cancel), or another GPU's claim is taking it. Nothing was
    written."""


# The change holding the lines lock is one short transaction.
LINES_BUSY_RETRY_SECONDS = 0.005
LINES_BUSY_MAX_TRIES = 200


def job_claim_next(
    *, resident_model: str | None, worker: str, gpu: int | None = None
) -> ClaimOutcome:
    """Mark the best queued job that GPU `gpu` (an id; None: this process's
    configured GPU) can run running on it, and record why; otherwise say
    why not (the GPU is busy, the only heads' callers are gone, `NoClaim`)."""
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
) -> ClaimOutcome:
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
    dispatcher would grant the same job. Nothing is written unless a job
    is claimed: the GPU is busy, its dispatcher is claiming, or another job
    wins (the last GPU tried says which).
    """
    assert connection.in_atomic_block, "gateway_claim runs inside the caller's transaction"
    gpu_ids = [gpu] if gpu is not None else idle_gpus_running(model)
    outcome: ClaimOutcome = NoClaim(Unclaimed.NOTHING, f"no GPU has room for {model}")
    for gpu_id in gpu_ids:
        outcome = _try_claim(resident_model=None, worker=worker, gpu_id=gpu_id, for_gateway=gateway)
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
    return _try_claim(resident_model=resident_model, worker=worker, gpu_id=gpu, for_gateway=None)


def _try_claim(
    *, resident_model: str | None, worker: str, gpu_id: int, for_gateway: int | None
) -> ClaimOutcome:
    """The claim's steps inside a transaction that holds other locks: every
    lock only tried."""
    try:
        return _claim_steps(
            resident_model=resident_model,
            worker=worker,
            gpu_id=gpu_id,
            for_gateway=for_gateway,
            wait_for_gpu=False,
        )
    except _LinesBusy:
        return NoClaim(Unclaimed.HELD, "the winner is being changed by another transaction")


def _claim_next(
    *, resident_model: str | None, worker: str, gpu_id: int, wait_for_lines: bool = False
) -> ClaimOutcome:
    with transaction.atomic(durable=True):
        return _claim_steps(
            resident_model=resident_model,
            worker=worker,
            gpu_id=gpu_id,
            for_gateway=None,
            wait_for_gpu=True,
            wait_for_lines=wait_for_lines,
        )


def _claim_steps(
    *,
    resident_model: str | None,
    worker: str,
    gpu_id: int,
    for_gateway: int | None,
    wait_for_gpu: bool,
    wait_for_lines: bool = False,
) -> ClaimOutcome:
    """The claim's steps for GPU `gpu_id`, in the caller's transaction:
    snapshot, `decide`, apply. `wait_for_gpu`: wait for the GPU's claim lock
    (the dispatcher's own transaction) or only try it (a transaction
    holding other locks)."""
    if not _lock_claims(gpu_id, wait=wait_for_gpu):
        return NoClaim(Unclaimed.CLAIMING, "another claim of this GPU is under way")
    state = gpu_state_read(gpu_id)
    if for_gateway is not None:
        resident_model = state.gpu.resident_model or None
    snapshot = state.snapshot(resident_model=resident_model)
    closed = snapshot.closed()
    if state.running_job_id is not None and (closed is Outcome.FULL or state.running_caller_gone):
        return _busy(state, state.running_job_id)
    if closed is not None:
        return NoClaim(Unclaimed.STOPPED, "dispatch is paused or the GPU is disabled")
    decided = heads_decided(state, snapshot)
    if not isinstance(decided, tuple):
        return decided
    heads, decision = decided
    if decision.outcome is Outcome.NOTHING and decision.skipped_for(Skip.OVERDUE):
        # Past their wait bound (decide's rule): expired, then claimed again.
        return HeadsOverdue(sorted(decision.skipped_for(Skip.OVERDUE)))
    if decision.outcome is Outcome.DRAIN:
        # A better job of another model waits for this GPU: it drains, and
        # its model gets no new slot, or a stream of its jobs would hold
        # the swap off for ever.
        assert state.running_job_id is not None  # jobs are in flight
        return _busy(state, state.running_job_id, draining=True)
    if decision.outcome is not Outcome.START:
        return NoClaim(Unclaimed.NOTHING, decision.reason)
    started = _start_first_free(
        decision,
        heads,
        state=state,
        worker=worker,
        for_gateway=for_gateway,
        wait_for_lines=wait_for_lines,
    )
    if isinstance(started, NoClaim):
        return started  # the dispatcher grants it; nothing is written here
    claim, ranked = started
    _record(claim, ranked, heads, state=state, decision=decision, worker=worker)
    return claim


def heads_decided(
    state: GpuState, snapshot: Snapshot
) -> tuple[dict[int, Head], Decision] | ClaimOutcome:
    """The heads read (snapshot.py's pre-filter), and `decide` over them.
    When nothing else may take the GPU, the heads are read again with those
    of the members at their running limit who may borrow it
    (decide.Borrowing): the pre-filter left them out."""
    decided = _heads_and_decision(state, snapshot)
    nothing = (
        decided[1].outcome is Outcome.NOTHING
        if isinstance(decided, tuple)
        else isinstance(decided, NoClaim) and decided.kind is Unclaimed.NOTHING
    )
    if nothing and state.may_lend(snapshot):
        decided = _heads_and_decision(state, snapshot, borrowing=True)
    return decided


def _heads_and_decision(
    state: GpuState, snapshot: Snapshot, *, borrowing: bool = False
) -> tuple[dict[int, Head], Decision] | ClaimOutcome:
    heads = _live_heads(state, snapshot, borrowing=borrowing)
    if not isinstance(heads, dict):
        return heads
    decision = decide(
        replace(snapshot, heads=[head.candidate for head in heads.values()]),
        # Terms for as many as claims at the same instant may need to skip.
        top=max(LEADING_CANDIDATES, state.gpu_count),
    )
    return heads, decision


def _live_heads(
    state: GpuState, snapshot: Snapshot, *, borrowing: bool = False
) -> dict[int, Head] | ClaimOutcome:
    """The queue-line heads the GPU may take, but those whose caller's web
    process died: such a caller is never granted the GPU."""
    all_heads = state.heads(snapshot, borrowing=borrowing)
    heads = {job_id: head for job_id, head in all_heads.items() if not head.caller_gone}
    if heads:
        return heads
    if all_heads:
        return CallersGone(sorted(all_heads))
    return NoClaim(Unclaimed.NOTHING, "nothing queued that this GPU may take")


def _record(
    claim: ClaimedJob,
    ranked: list[RankedCandidate],
    heads: dict[int, Head],
    *,
    state: GpuState,
    decision: Decision,
    worker: str,
) -> None:
    """The decision's row, the lane's move and the job's `started` event,
    in one statement (decisions.py)."""
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
        settings=settings,
        previous_finished_at=state.previous_finished_at,
        attempt=winner.next_attempt,
        worker=worker,
        path=winner.path,
        gpu_slot=claim.gpu_slot,
        in_flight=claim.in_flight,
        borrowed=decision.borrowed,
    )


def _start_first_free(
    decision: Decision,
    heads: dict[int, Head],
    *,
    state: GpuState,
    worker: str,
    for_gateway: int | None,
    wait_for_lines: bool,
) -> tuple[ClaimedJob, list[RankedCandidate]] | NoClaim:
    """Start the first of the decision's startable heads that is free; the
    claim and the ranking with it first.

    With several GPUs, claims made at the same instant rank the same jobs:
    the one whose row another GPU's claim holds is being started there, so
    this claim starts the next one at once, in its own transaction, rather
    than claim again later. With one GPU a held row is a cancel in progress,
    and the claim is made again (_LinesBusy), as it is when the member's
    lines are busy."""
    ranked = list(decision.ranked)
    for entry in decision.startable:
        winner = heads[entry.candidate.job_id]
        if for_gateway is not None and winner.gateway != for_gateway:
            return NoClaim(Unclaimed.ANOTHER_JOB, "the winner is not this web process's caller")
        if wait_for_lines:
            # The last try waits for the member's lines (queueapp/locks.py);
            # the others only try them.
            lock_member_lines(winner.candidate.member_id)
        elif state.gpu_count > 1 and not try_lock_member_lines(winner.candidate.member_id):
            # With several GPUs the member's running limit is checked in
            # the UPDATE, whose snapshot must follow the lines lock: another
            # GPU's claim of the member's job commits before it lets it go.
            raise _LinesBusy
        claim = _start(winner, entry, decision, state=state, worker=worker, wait=wait_for_lines)
        if claim is not None:
            return claim, [entry, *(other for other in ranked if other is not entry)]
        if state.gpu_count <= 1:
            raise _LinesBusy
    if len(decision.startable) < len(ranked):
        # The next best is of another model: the slot stays free for now.
        return NoClaim(Unclaimed.ANOTHER_JOB, "a free slot is only for the model in flight")
    raise _LinesBusy


def _start(
    winner: Head,
    ranked_entry: RankedCandidate,
    decision: Decision,
    *,
    state: GpuState,
    worker: str,
    wait: bool = False,
) -> ClaimedJob | None:
    """The winner running on the GPU in the decision's slot
    (transitions.start), as a claim; None when its row or its member's
    lines are held, or its member reached the running limit meanwhile."""
    chosen = ranked_entry.candidate
    terms = ranked_entry.terms.as_dict()
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
        wait=wait,
        # One GPU: the limit counts GPUs held, so it cannot bind. A borrowed
        # GPU is lent past it.
        check_limit=state.gpu_count > 1 and not decision.borrowed,
    )
    if started is None:
        return None
    return ClaimedJob(
        job_id=chosen.job_id,
        path=winner.path,
        body=started.body,
        model=chosen.model,
        claim_token=token,
        lease_seconds=state.policy.lease_seconds,
        swap_needed=chosen.model != decision.affinity_model,
        granted=winner.front_door,
        effective_score=terms["effective"],
        gpu_id=state.gpu_id,
        upstream_url=state.url,
        gpu_slot=decision.slot,
        in_flight=decision.in_flight + 1,
        shared=started.parallel > 1,
    )


def _lock_claims(gpu_id: int, *, wait: bool) -> bool:
    """The GPU's claim lock. The dispatcher waits for it; a front-door web
    process, or any claim made in a transaction that holds a job's row
    already, only tries it, and claims nothing when another claim holds it."""
    if wait:
        lock_gpu_claim(gpu_id)
        return True
    return try_lock_gpu_claim(gpu_id)


def _busy(state: GpuState, running_job_id: int, *, draining: bool = False) -> GpuBusy:
    """A running job, and how long until it is worth looking again."""
    expires = state.running_lease_expires_at or state.now  # a running job has a lease
    left = (expires - state.now).total_seconds()
    return GpuBusy(
        running_job_id,
        seconds_left=min(max(left, 0.0), BUSY_RECHECK_SECONDS),
        caller_gone=state.running_caller_gone,
        draining=draining,
    )
