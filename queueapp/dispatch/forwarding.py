"""One claimed job forwarded to llama-swap and its answer stored.

The body is posted to the job's path (or its model loaded, a preload) while
a heartbeat renews the lease (queueapp/dispatch/heartbeat.py); the answer
ends the job (`job_end_durable`), or ends it and claims the GPU's next job
in the same commit (`job_end_and_claim_next`), the write retried while
PostgreSQL is away (queueapp/dispatch/database_retry.py). A front-door job
is granted, not forwarded: its caller's web process makes the call. A body
llama-swap did not take (unreachable, or busy with another client: 429) is
`Refused`, and its job goes back to its place in the queue; so does one
whose API key llama-swap refused (401), which also marks the GPU unhealthy.
What each llama-swap answer means for the job: queueapp/upstream/client.py.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field

from django.conf import settings

from queueapp import services
from queueapp.dispatch.database_retry import BACKOFF_MAX_SECONDS, until_database_answers
from queueapp.dispatch.gpu_state import GpuStateRecorder
from queueapp.dispatch.heartbeat import heartbeat as heartbeat_of
from queueapp.dispatch.lease import (
    job_end_and_claim_next,
    job_end_durable,
    job_return_to_queue,
    job_was_cut_by_unload,
)
from queueapp.dispatch.outcomes import ClaimedJob
from queueapp.dispatch.wakeup import STOP_REQUESTED
from queueapp.errors import DATABASE_ERRORS
from queueapp.upstream.client import (
    CUT_STATUSES,
    LlamaSwapClient,
    UpstreamAnswer,
    UpstreamBroken,
    UpstreamKeyRefused,
    UpstreamUnreachable,
    is_preload,
    preload_answer,
)
from queueapp.upstream.llama_swap_state import READY

logger = logging.getLogger(__name__)


@dataclass
class PassReport:
    dispatched: list[int] = field(default_factory=list)
    returned: int = 0
    ended_because: str = ""

    def summary(self) -> str:
        return (
            f"dispatched {len(self.dispatched)} job(s), returned {self.returned} to the "
            f"queue; stopped: {self.ended_because}"
        )


@dataclass(frozen=True)
class Refused:
    """llama-swap did not take a job's body (unreachable, or busy with
    another client: 429), so the job went back to the queue."""

    retry_after: float | None  # its Retry-After; None: back off


def run_claimed(
    client: LlamaSwapClient,
    claim: ClaimedJob,
    report: PassReport,
    gpu_state: GpuStateRecorder,
    *,
    worker: str,
    claim_next: bool,
    heartbeat: bool = True,
) -> Refused | ClaimedJob | None:
    """Forward one claimed job. `Refused` when llama-swap did not take it
    (the job went back to the queue); with `claim_next`, the next job when
    it was claimed in the commit that ended this one (after an answer,
    llama-swap has the job's model loaded: the next claim needs no GET
    /running)."""
    if claim.granted:
        # The caller's web process makes the call; the next claim finds the
        # GPU busy and waits for the job's end on the work channel.
        report.dispatched.append(claim.job_id)
        return None
    answer: UpstreamAnswer | None = None
    error: str | None = None
    if is_preload(claim.path) and claim.swap_needed is False:
        # A preload of the model llama-swap has ready: it ends at once, no call.
        answer = preload_answer(claim.model, upstream_status=None)
    else:
        with heartbeat_of(claim) if heartbeat else contextlib.nullcontext():
            try:
                answer = _call_upstream(client, claim)
            except UpstreamUnreachable as exc:
                if isinstance(exc, UpstreamKeyRefused):
                    # Its next probe would say so too; health says it now.
                    gpu_state.record(reachable=False, resident=None, error=str(exc))
                return_to_queue(claim=claim, reason=str(exc), report=report)
                return Refused(retry_after=None)
            except UpstreamBroken as exc:
                error = str(exc)
    if answer is not None and _cut_by_unload(client, claim, answer):
        # Not the job's fault nor its caller's: it runs again, once.
        reason = f"llama-swap unloaded {claim.model} while it ran (answered {answer.status_code})"
        return_to_queue(claim=claim, reason=reason, report=report, cut_by_unload=True)
        return Refused(retry_after=0.0)
    if answer is not None and answer.is_busy:
        # llama-swap's own concurrency limit, hit by another client: the body
        # was refused, not run, so the job keeps its place.
        return_to_queue(claim=claim, reason="llama-swap busy (429)", report=report)
        return Refused(retry_after=min(max(answer.retry_after or 1.0, 0.1), BACKOFF_MAX_SECONDS))
    answered = answer is not None and 200 <= answer.status_code < 300
    if answered:
        server_slots_read(client, gpu_state, claim.model)
    following = until_database_answers(
        lambda: _job_end(claim, answer, error, claim_next=answered and claim_next, worker=worker),
        claim=claim,
    )
    report.dispatched.append(claim.job_id)
    if answered:
        # llama-swap has this model loaded now; the queue view scores
        # affinity by it until the next probe.
        gpu_state.loaded(claim.model)
    return following


def server_slots_read(client: LlamaSwapClient, gpu_state: GpuStateRecorder, model: str) -> None:
    """Ask `model`'s server, once per load, how many requests it answers at
    once, and record it (queueapp/policy/server_slots.py).

    Asked after a job of it answered and before that job's end is written:
    the job still holds the GPU, so no job of gpusched's can unload the
    model meanwhile (a swap waits for the GPU's jobs to end), and llama-swap
    never has to load it again to answer (it would, for a model not
    loaded). Only another client's request or a `ttl` could unload it in
    those milliseconds."""
    if not gpu_state.slots_unasked(model):
        return
    try:
        slots = client.server_slots(model)
        if slots is not None:  # None: not a server that says; its config's count stands
            services.gpu_server_slots_record(gpu_id=gpu_state.gpu_id, model=model, slots=slots)
    except (UpstreamUnreachable, *DATABASE_ERRORS) as exc:
        logger.info(
            "%s: %s's slots not read now (asked again after its next job): %s",
            gpu_state.gpu_name,
            model,
            exc,
        )
        gpu_state.slots_not_recorded(model)


def return_to_queue(
    *, claim: ClaimedJob, reason: str, report: PassReport, cut_by_unload: bool = False
) -> None:
    """A claim whose body llama-swap never ran (or cut short) undone: the job
    back at its place, counted in the pass's report."""
    until_database_answers(
        lambda: job_return_to_queue(claim=claim, reason=reason, cut_by_unload=cut_by_unload),
        claim=claim,
    )
    report.returned += 1


def _cut_by_unload(client: LlamaSwapClient, claim: ClaimedJob, answer: UpstreamAnswer) -> bool:
    """Whether llama-swap cut this job by unloading its model, the first time:
    an answer of a cut, and its model no longer ready at llama-swap."""
    if answer.status_code not in CUT_STATUSES or is_preload(claim.path):
        return False
    try:
        still_ready = client.running_states().get(claim.model) == READY
    except UpstreamUnreachable:
        still_ready = False  # llama-swap itself went away with the model
    return not still_ready and not job_was_cut_by_unload(claim.job_id)


def _job_end(
    claim: ClaimedJob,
    answer: UpstreamAnswer | None,
    error: str | None,
    *,
    claim_next: bool,
    worker: str,
) -> ClaimedJob | None:
    # Read at the end, not when the call began: a stop that came during
    # the call claims nothing more.
    if claim_next and not STOP_REQUESTED.is_set():
        return job_end_and_claim_next(
            claim=claim,
            answer=answer,
            error=error,
            inline_limit=settings.GPUSCHED_RESULT_INLINE_BYTES,
            resident_model=claim.model,
            worker=worker,
        )
    job_end_durable(
        claim=claim,
        answer=answer,
        error=error,
        inline_limit=settings.GPUSCHED_RESULT_INLINE_BYTES,
    )
    return None


def _call_upstream(client: LlamaSwapClient, claim: ClaimedJob) -> UpstreamAnswer:
    """The job's call: its body posted to its path, or its model loaded (a preload)."""
    if is_preload(claim.path):
        return client.preload(claim.model, job_id=claim.job_id)
    return client.forward(claim.path, claim.body, job_id=claim.job_id)
