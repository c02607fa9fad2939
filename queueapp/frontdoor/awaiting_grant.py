"""A queued front-door call waits for its job's grant, as a coroutine.

The call's future resolves when the job is granted a GPU, or ends first
(queueapp/frontdoor/gateway.py says how the grant reaches it); a waiting
stream sends its status lines meanwhile (queueapp/frontdoor/waiting.py). A
caller that hangs up while queued cancels its job: nothing ran, nothing is
left behind. A job whose `X-Gpusched-Max-Wait` bound passes expires, and the
caller gets the same 503 `gpu_busy` as a bound refused at admission.

A grant is used only while it is still this call's: one that reached the
call late is renewed first (`claim_to_use`). A granted GPU whose llama-swap
refuses every connection gives the job back to the queue (`give_back`), and
the call waits on for the next grant, on any GPU that can run it; a grant
still carrying the claim it gave back is stale and not used. One whose
llama-swap refuses gpusched's API key is a configuration problem that no
wait mends (`refused_key`): the job goes back with its attempts unchanged
and is cancelled, and the caller gets 503 `upstream_key_refused`, which
names gpusched's configuration, not the caller's key.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from queueapp.dispatch.claim import ClaimedJob
from queueapp.dispatch.lease import job_lease_renew, job_return_to_queue
from queueapp.errors import WaitBoundUnmet
from queueapp.eta import seconds_until_first_start
from queueapp.frontdoor.answers import Answer, Reply, gpu_busy, job_headers
from queueapp.frontdoor.gateway import Grant, abandon, db, gateway
from queueapp.frontdoor.incoming_call import Call
from queueapp.frontdoor.waiting import Lines, granted_while_commenting
from queueapp.models import Gpu, Job, JobStatus
from queueapp.upstream.client import UpstreamCut, UpstreamKeyRefused, UpstreamUnreachable

# The Retry-After of a call refused because llama-swap refused gpusched's
# key: an operator has to change a setting, so not soon.
KEY_REFUSED_RETRY_SECONDS = 60


@dataclass(frozen=True)
class Shown:
    """Where a waiting stream's lines go, and in which form."""

    reply: Reply
    lines: Lines


async def granted(
    job: Job, waiting: asyncio.Future[Grant], *, given_back: str | None, shown: Shown | None
) -> Grant:
    """What became of the queued job: granted or ended. A grant with the
    token this call gave back (`given_back`) is stale: housekeeping read it
    before the return committed, or its notice came late; wait on. With
    `shown`, a stream's, its lines go out meanwhile."""
    try:
        grant = await _until_granted(job, waiting, shown)
        while grant.claim is not None and grant.claim.claim_token == given_back:
            # A fresh grant's notice arriving before this line is not lost:
            # housekeeping delivers it within HOUSEKEEPING_SECONDS.
            grant = await _until_granted(job, gateway.expect(job.pk), shown)
    except asyncio.CancelledError:
        # The caller hung up while queued: nothing ran, nothing is left behind.
        await asyncio.shield(db(abandon)(job.pk, "the caller disconnected while queued"))
        raise
    return grant


async def _until_granted(job: Job, waiting: asyncio.Future[Grant], shown: Shown | None) -> Grant:
    if shown is None or waiting.done():
        return await waiting
    return await granted_while_commenting(
        waiting,
        reply=shown.reply,
        headers=job_headers(job, None),
        job_id=job.pk,
        board=gateway.statuses,
        interval=settings.GPUSCHED_STREAM_COMMENT_SECONDS,
        lines=shown.lines,
    )


async def claim_to_use(
    call: Call, job: Job, grant: Grant, *, body: dict[str, Any], model: str
) -> ClaimedJob | Answer:
    """The claim a grant gives this call, or the answer when the job ended
    instead (expired: 503 `gpu_busy`; cancelled or failed: 409) or its turn
    lapsed before this call could use it. `body`: the request as its job
    stores it (`CallBody.stored`)."""
    if grant.status == JobStatus.EXPIRED:
        return gpu_busy(await db(_expired_refusal)(job.pk)).with_headers(job_headers(job, None))
    if grant.status != JobStatus.RUNNING:
        return Answer.error(
            409,
            f"job {job.pk} was {grant.status} before it ran",
            "invalid_request_error",
            f"job_{grant.status}",
        ).with_headers(job_headers(job, None))
    assert grant.claim is not None
    held = grant.claim
    claim = (
        held
        if isinstance(held, ClaimedJob)
        else held.to_caller(
            path=call.path,
            body=body,
            model=model,
            upstream_url=await gateway.upstream_url(held.gpu_id),
        )
    )
    if grant.lease_expires_at and grant.lease_expires_at - time.time() < claim.lease_seconds / 2:
        # The grant reached this call late (a busy process): make sure the
        # GPU is still this call's before using it.
        if not await db(job_lease_renew, gpu_path=True)(claim=claim):
            return Answer.error(
                503,
                f"job {job.pk} was granted the GPU but its turn lapsed before this server "
                "could use it; try again",
                "server_error",
                "grant_lapsed",
                Retry_After="1",
            ).with_headers(job_headers(job, claim.effective_score))
    return claim


async def give_back(job: Job, claim: ClaimedJob, unreachable: UpstreamUnreachable) -> bool:
    """Return the job to the queue from the GPU whose llama-swap refused
    every connection, or cut the call by unloading its model; False when the
    job was no longer this claim's."""
    returning = asyncio.ensure_future(
        db(_job_return_unreachable, gpu_path=True)(claim=claim, unreachable=unreachable)
    )
    try:
        return await asyncio.shield(returning)
    except asyncio.CancelledError:
        # The caller hung up as its job went back: cancel it once it is queued.
        with contextlib.suppress(Exception):
            await returning
        await asyncio.shield(db(abandon)(job.pk, "the caller disconnected while queued"))
        raise


async def refused_key(job: Job, claim: ClaimedJob, refused: UpstreamKeyRefused) -> Answer:
    """The GPU's llama-swap refused gpusched's key: the job back to the queue
    (nothing ran) and cancelled, and the 503 that says whose problem it is."""
    gpu = await asyncio.shield(
        db(_job_return_and_cancel, gpu_path=True)(claim=claim, refused=refused)
    )
    return Answer.error(
        503,
        f"gpusched cannot use GPU {gpu}: {refused}. This is gpusched's configuration, not "
        f"your key; your request was not run and job {job.pk} was cancelled",
        "server_error",
        "upstream_key_refused",
        Retry_After=str(KEY_REFUSED_RETRY_SECONDS),
    ).with_headers(job_headers(job, claim.effective_score))


def _job_return_and_cancel(*, claim: ClaimedJob, refused: UpstreamKeyRefused) -> str:
    """`job_return_to_queue`, then the cancel: its caller is answered. The GPU's name."""
    gpus = Gpu.objects.filter(pk=claim.gpu_id) if claim.gpu_id is not None else Gpu.objects.none()
    gpu = gpus.values_list("name", flat=True).first() or claim.upstream_url
    reason = f"{refused} (GPU {gpu})"
    if job_return_to_queue(claim=claim, reason=reason):
        abandon(claim.job_id, f"{reason}; the caller was answered 503")
    return gpu


def _expired_refusal(job_id: int) -> WaitBoundUnmet:
    """A queued job's bound passed: its error (what held the GPUs), and when
    the first GPU should free as the time to try again."""
    error = Job.objects.filter(pk=job_id).values_list("error", flat=True).first()
    return WaitBoundUnmet(
        f"job {job_id} expired: {error or 'its wait bound passed'}",
        retry_after=seconds_until_first_start([]),
    )


def _job_return_unreachable(*, claim: ClaimedJob, unreachable: UpstreamUnreachable) -> bool:
    """`job_return_to_queue`, its reason naming the GPU whose llama-swap
    refused, or unloaded the model under the call (`UpstreamCut`: once)."""
    gpus = Gpu.objects.filter(pk=claim.gpu_id) if claim.gpu_id is not None else Gpu.objects.none()
    gpu = gpus.values_list("name", flat=True).first()
    where = f"{gpu} ({claim.upstream_url})" if gpu else claim.upstream_url
    if isinstance(unreachable, UpstreamCut):
        return job_return_to_queue(
            claim=claim, reason=f"{unreachable} on {where}", cut_by_unload=True
        )
    return job_return_to_queue(
        claim=claim, reason=f"llama-swap unreachable at {where}: {unreachable}"
    )
