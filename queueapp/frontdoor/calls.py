"""The OpenAI-compatible front door: llama-swap's own paths, queued and scheduled.

A caller changes its base URL from llama-swap to gpusched and adds
`X-LlamaSwap-Priority`, or a `priority` in its JSON body. Each call becomes
a job (same scoring, audit, dashboard and `why`). The call waits, as a
coroutine, until its job is granted the GPU (queueapp/frontdoor/gateway.py);
then this process makes the upstream call itself under the job's lease,
relays llama-swap's answer unchanged, and finishes the job with what it
relayed.

This module is the ASGI entry: it reads the body, runs the call as a task
of its own that a hang-up cancels, and answers what nobody expected with
the last resort's JSON 500. A call's steps each have a module:
- admission.py: the body read and refused, the wait bound, the key checked
  (authentication.py), the job queued and the claim at admission;
- awaiting_grant.py: the wait for the grant, and a grant given back;
- relay.py: the request to llama-swap, its answer relayed, the job's end,
  a caller gone mid-call (dispatch/lease_keeper.py keeps the lease meanwhile);
- model_list.py: `GET /v1/models`.

This is a plain ASGI application in front of Django (gpusched/asgi.py): a
waiting call runs no middleware and holds no thread. A caller that
disconnects while queued cancels its job; one that disconnects while its job
runs ends it as failed, with the reason, once its model's `on_caller_gone`
has closed the request to llama-swap or drained its answer
(queueapp/frontdoor/exchange.py says why a drain holds the GPU).

Why the caller's own connection makes the call: the job is still claimed by
the one claim (score, decision, audit, lease), and relaying the answer from
the dispatcher through the channel layer instead would copy every chunk
across two processes. Why in front of Django: through Django every request
runs its signals and sync middleware on a thread that lives as long as the
request and holds its database connection, so a thousand waiting callers
were a thousand threads and the pool ran out (503). How many calls one
process lets wait: queueapp/frontdoor/admission.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from django.conf import settings
from django.db import InterfaceError, OperationalError
from django.http.request import split_domain_port, validate_host

from queueapp.errors import (
    DATABASE_ERRORS,
    DATABASE_RETRY_AFTER_SECONDS,
    DATABASE_UNAVAILABLE,
    SERVER_BUSY,
    SERVER_BUSY_RETRY_AFTER_SECONDS,
    pool_exhausted,
)
from queueapp.frontdoor.admission import (
    AdmissionRefused,
    CallBody,
    Queued,
    admit,
    read_body,
    wait_bound,
)
from queueapp.frontdoor.answers import Answer, Reply, Send, job_headers
from queueapp.frontdoor.awaiting_grant import (
    Shown,
    claim_to_use,
    give_back,
    granted,
    refused_key,
)
from queueapp.frontdoor.gateway import abandon, db, gateway
from queueapp.frontdoor.incoming_call import Call
from queueapp.frontdoor.model_list import MODELS_PATH, list_models
from queueapp.frontdoor.relay import relay
from queueapp.frontdoor.waiting import comments_while_queued, lines_for
from queueapp.job_body import front_door_body_limit
from queueapp.upstream.client import UpstreamKeyRefused, UpstreamUnreachable

logger = logging.getLogger(__name__)

Receive = Callable[[], Awaitable[dict[str, Any]]]


class _Sent:
    """The caller's ASGI `send`, and how far the answer got: what the last
    resort may still say."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self.started = False
        self.ended = False
        self.stream = False

    async def __call__(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.started = True
            headers = dict(message.get("headers") or [])
            self.stream = b"text/event-stream" in headers.get(b"content-type", b"")
        elif not message.get("more_body", False):
            self.ended = True
        await self._send(message)


async def front_door_app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
    """ASGI entry of the front door's paths. Nothing raised here reaches the
    web server, whose answer would be an HTML page: an unexpected exception
    is logged with an error id and answered as OpenAI's JSON 500 with that id
    (or, in a stream whose head went out, as its last event)."""
    sent = _Sent(send)
    try:
        await _front_door(scope, receive, sent)
    except Exception:
        error_id = uuid.uuid4().hex[:16]
        logger.exception(
            "front door: %s %s failed; error id %s",
            scope.get("method"),
            scope.get("path"),
            error_id,
        )
        if sent.ended:
            return
        answer = Answer.error(
            500,
            f"gpusched failed to answer this call; its log has the details under error id "
            f"{error_id}",
            "server_error",
            "internal_error",
            X_Gpusched_Error_Id=error_id,
        )
        with contextlib.suppress(Exception):  # the caller may be gone
            if not sent.started:
                await answer.send(sent)
            else:
                last = answer.as_event() if sent.stream else b""
                await sent({"type": "http.response.body", "body": last, "more_body": False})


async def _front_door(scope: dict[str, Any], receive: Receive, send: Send) -> None:
    call = Call.from_scope(scope)
    limit = front_door_body_limit(call.path)
    chunks, size, more = [], 0, True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        chunk = message.get("body", b"")
        size += len(chunk)
        if size <= limit.bytes:
            chunks.append(chunk)
        more = message.get("more_body", False)
    call.body = b"".join(chunks)
    del chunks  # the one copy a waiting call keeps is call.body
    if size > limit.bytes:
        await Answer.error(
            413, limit.refusal(size, call.path), "invalid_request_error", "request_too_large"
        ).send(send)
        return
    # The call runs as its own task so that a hang-up cancels it at once.
    serving = asyncio.ensure_future(_serve(call, send))
    hang_up = asyncio.ensure_future(_until_disconnect(receive))
    try:
        await asyncio.wait({serving, hang_up}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not serving.done():
            serving.cancel()
        hang_up.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await serving


async def _until_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _serve(call: Call, send: Send) -> None:
    reply = Reply(send)
    try:
        answer = await _answer(call, reply)
    except DATABASE_ERRORS as exc:
        answer = _database_problem(exc)
    if answer is not None:
        await reply.answer(answer)


def _database_problem(exc: OperationalError | InterfaceError) -> Answer:
    if pool_exhausted(exc):
        return Answer.error(
            503,
            SERVER_BUSY,
            "server_error",
            "server_busy",
            Retry_After=str(SERVER_BUSY_RETRY_AFTER_SECONDS),
        )
    return Answer.error(
        503,
        DATABASE_UNAVAILABLE,
        "server_error",
        "database_unavailable",
        Retry_After=str(DATABASE_RETRY_AFTER_SECONDS),
    )


def _host_refused(call: Call) -> Answer | None:
    domain, _ = split_domain_port(call.headers.get("host", ""))
    if domain and validate_host(domain, settings.ALLOWED_HOSTS):
        return None
    return Answer.error(400, "the Host header is not allowed here", "invalid_request_error")


async def _answer(call: Call, reply: Reply) -> Answer | None:
    refused = _host_refused(call)
    if refused is not None:
        return refused
    if call.path == MODELS_PATH:
        return await list_models(call)
    if call.method != "POST":
        return Answer.error(
            405, f"{call.method} is not allowed here; use POST", "invalid_request_error"
        )
    content_type = call.headers.get("content-type", "")
    body = read_body(call, content_type)
    bound = wait_bound(call)
    over_limit = gateway.calls >= settings.GPUSCHED_FRONT_DOOR_MAX_WAITING
    await gateway.ready()
    gateway.calls += 1
    # Until the job is registered, a grant for an unknown job may be this one's.
    gateway.submitting += 1
    try:
        try:
            admission = await admit(call, body, bound, over_limit=over_limit)
        finally:
            gateway.submitting -= 1
            gateway.release_unclaimed_grants()
        if isinstance(admission, AdmissionRefused):
            return admission.answer
        job = admission.job
        try:
            return await _wait_and_relay(call, reply, admission, body, content_type)
        except Exception:
            # A fault of gpusched's own (the last resort answers it): the job
            # is not left queued, or holding a GPU, for a caller it will not
            # serve. A relay that failed has ended its job already.
            if not gateway.finishing(job.pk):
                with contextlib.suppress(Exception):
                    await asyncio.shield(db(abandon)(job.pk, "gpusched failed on this call"))
            raise
        finally:
            gateway.forget(job.pk)
    finally:
        gateway.calls -= 1


async def _wait_and_relay(
    call: Call, reply: Reply, queued: Queued, body: CallBody, content_type: str
) -> Answer | None:
    """Wait for the grant, make the call on the granted GPU, and wait again
    for another grant while a GPU's llama-swap refuses every connection."""
    job, waiting = queued.job, queued.waiting
    streaming = body.stored.get("stream") is True
    # A waiting stream shows life: comment lines while queued (waiting.py).
    shown = (
        Shown(reply, lines_for(call.path, call.headers, job_id=job.pk, model=body.model))
        if comments_while_queued(call.path, body.stored)
        else None
    )
    given_back: str | None = None  # the claim token of the last grant this call gave back
    while True:
        grant = await granted(job, waiting, given_back=given_back, shown=shown)
        claim = await claim_to_use(call, job, grant, body=body.stored, model=body.model)
        if isinstance(claim, Answer):
            return claim
        relayed = await relay(call, reply, job, claim, content_type, streaming=streaming)
        if isinstance(relayed, UpstreamKeyRefused):
            return await refused_key(job, claim, relayed)
        if not isinstance(relayed, UpstreamUnreachable):
            return relayed
        # Armed before the return commits: a grant that follows at once (the
        # other GPU idle) finds this call waiting for it.
        waiting = gateway.expect(job.pk)
        if not await give_back(job, claim, relayed):
            return Answer.error(
                502,
                f"llama-swap did not accept the connection ({relayed}), and job {job.pk}'s "
                "turn lapsed meanwhile",
                "server_error",
                "upstream_unreachable",
            ).with_headers(job_headers(job, claim.effective_score))
        given_back = claim.claim_token
