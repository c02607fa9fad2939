"""A granted call's turn on the GPU: the request to llama-swap and its
answer relayed.

Under the job's lease (renewed while the call runs,
queueapp/dispatch/lease_keeper.py) this process posts the caller's
original bytes to the granted GPU's llama-swap, relays its answer unchanged
(status, content type, body; server-sent events chunk by chunk as they
arrive) and finishes the job with what it relayed; the caller gets the
answer first, the end is written meanwhile (`Gateway.finish_soon`). A
llama-swap busy with another client (429) is waited for: this call holds
the GPU. One that refuses connections gets a few tries; then the job goes
back to the queue, as the dispatcher's does, and the caller waits on its
open connection for the next grant (queueapp/frontdoor/awaiting_grant.py).
One that unloads the call's model under it (its 502, or 500 while it waited
for the load; `UpstreamCut`) sends the job back once in the same way. One
that refuses gpusched's API key (401) is a configuration problem no
wait mends: the job goes back to the queue and is cancelled, and the caller
gets 503 `upstream_key_refused` at once (queueapp/frontdoor/calls.py).

A caller that hangs up while its job runs ends it as failed, with the
reason, once its model's `on_caller_gone` has closed the request to
llama-swap or drained its answer (queueapp/frontdoor/exchange.py says why a
drain holds the GPU).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping

import httpx

from queueapp.dispatch.claim import ClaimedJob
from queueapp.dispatch.lease import job_caller_left, job_was_cut_by_unload
from queueapp.dispatch.lease_keeper import LeaseKeeper
from queueapp.errors import DATABASE_ERRORS
from queueapp.frontdoor.answers import Answer, Headers, Reply, job_headers
from queueapp.frontdoor.exchange import UpstreamExchange, llama_swap_client
from queueapp.frontdoor.gateway import db, gateway
from queueapp.frontdoor.incoming_call import Call
from queueapp.http_headers import retry_after_seconds
from queueapp.models import Job, OnCallerGone
from queueapp.upstream.client import (
    CUT_STATUSES,
    UpstreamAnswer,
    UpstreamCut,
    UpstreamUnreachable,
    key_refused,
    key_refused_error,
)
from queueapp.upstream.llama_swap_state import FORWARDED_JOB_HEADER, READY, running_entries

UPSTREAM_RETRY_SECONDS = 1.0
# Connections the granted GPU's llama-swap may refuse in a row, retried
# UPSTREAM_RETRY_SECONDS apart, before the job goes back to the queue (the
# dispatcher returns its job at the first refusal: it has no caller to keep
# waiting). A llama-swap restarting to reload its config is back within
# that; one that stays down costs its caller a couple of seconds, not the
# whole wait, while another GPU could answer.
UPSTREAM_CONNECT_TRIES = 3


async def send_upstream(exchange: UpstreamExchange) -> httpx.Response:
    """Send the body. llama-swap busy with another client (429): wait and try
    again, this call holds the GPU. Refusing connections UPSTREAM_CONNECT_TRIES
    times in a row: UpstreamUnreachable (the body was never sent), and the
    job goes back to the queue for a GPU that answers."""
    refused = 0
    while True:
        try:
            response = await exchange.send()
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            refused += 1
            if refused >= UPSTREAM_CONNECT_TRIES:
                raise UpstreamUnreachable(
                    f"{refused} connections to llama-swap failed: {exc!r}"
                ) from exc
            await asyncio.sleep(UPSTREAM_RETRY_SECONDS)
            continue
        refused = 0
        if response.status_code != 429:
            return response
        await exchange.refused()
        await asyncio.sleep(
            retry_after_seconds(response.headers.get("retry-after")) or UPSTREAM_RETRY_SECONDS
        )


async def relay(
    call: Call, reply: Reply, job: Job, claim: ClaimedJob, content_type: str, *, streaming: bool
) -> Answer | UpstreamUnreachable | None:
    """The call made under the job's lease and its answer relayed (None: sent
    as a stream already); UpstreamUnreachable: nothing was sent, the lease is
    no longer renewed, and the job is the caller's to give back."""
    # The lease's renewal runs on the front door's GPU-path database threads.
    lease = LeaseKeeper.of(claim)
    lease.start_task(lambda step: db(step, gpu_path=True)())
    # Held until the job's end is written (finish_soon lets go), or here
    # when the call ends without one (abandoned).
    gateway.held.add(claim.job_id)
    try:
        return await _relay_holding(call, reply, job, claim, content_type, lease, streaming)
    finally:
        if not gateway.finishing(claim.job_id):
            gateway.held.discard(claim.job_id)


class _JobEnd:
    """Ends a granted job in the background, once: the caller's answer never
    waits for the database, and a hang-up after this point changes nothing."""

    def __init__(self, claim: ClaimedJob, lease: LeaseKeeper) -> None:
        self.claim = claim
        self.lease = lease
        self.done = False

    def __call__(
        self,
        answer: UpstreamAnswer | None,
        error: str | None,
        *,
        caller_gone: OnCallerGone | None = None,
    ) -> None:
        if self.done:
            return
        self.done = True
        self.lease.stop()
        gateway.finish_soon(claim=self.claim, answer=answer, error=error, caller_gone=caller_gone)


async def _relay_holding(
    call: Call,
    reply: Reply,
    job: Job,
    claim: ClaimedJob,
    content_type: str,
    lease: LeaseKeeper,
    streaming: bool,
) -> Answer | UpstreamUnreachable | None:
    headers = job_headers(job, claim.effective_score)
    end = _JobEnd(claim, lease)
    exchange: UpstreamExchange | None = None
    try:
        client = llama_swap_client(claim.upstream_url)
        # Only the caller's Content-Type as its bytes came (latin-1 both
        # ways: httpx would refuse a non-ASCII value as text), and gpusched's
        # own key: the caller's Authorization, x-api-key, Cookie and the
        # rest of its headers stay here.
        auth = await gateway.auth_headers(claim.gpu_id)
        # A header value's surrounding whitespace is not part of it (RFC 9110,
        # 5.5), and one of whitespace alone is none: httpx refuses to send it.
        sent_type = content_type.strip(" \t")
        request = client.build_request(
            "POST",
            claim.path,
            content=call.body,
            headers=[
                *([(b"content-type", sent_type.encode("latin-1"))] if sent_type else []),
                (FORWARDED_JOB_HEADER.encode(), str(claim.job_id).encode()),
                *((name.encode(), value.encode()) for name, value in auth.items()),
            ],
        )
        exchange = UpstreamExchange(client, request)
        try:
            response = await send_upstream(exchange)
            if key_refused(response.status_code, response.headers.get("www-authenticate")):
                await exchange.refused()
                raise key_refused_error(f"POST {claim.path}", sent_key=bool(auth))
            if response.status_code in CUT_STATUSES and await _cut_by_unload(client, claim, auth):
                await exchange.close()
                raise UpstreamCut(
                    f"llama-swap unloaded {claim.model} while it ran "
                    f"(answered {response.status_code})"
                )
        except UpstreamUnreachable as exc:
            lease.stop()
            return exc
        except httpx.HTTPError as exc:
            end(None, f"the call to llama-swap failed: {exc!r}")
            return Answer.error(
                502, "llama-swap did not answer", "server_error", "upstream_error"
            ).with_headers(headers)
        upstream_type = response.headers.get("content-type", "application/octet-stream")
        if not streaming or "text/event-stream" not in upstream_type:
            return await _relay_whole(exchange, response, upstream_type, headers, end)
        await _relay_stream(exchange, response, upstream_type, headers, end, reply)
        return None
    except asyncio.CancelledError:
        if not end.done and exchange is not None:  # set before the first await
            # The job's end waits for what the model's on_caller_gone does
            # with the request under way; the GPU stays held until then.
            gateway.after_caller_left(claim.job_id, _after_caller_left(exchange, end))
        raise
    except Exception as exc:
        # A fault of gpusched's own (the caller gets the last resort's 500):
        # the job ends failed and frees the GPU now, not when a lease that
        # nothing renews any more runs out.
        if not end.done:
            if exchange is not None:
                with contextlib.suppress(Exception):
                    await exchange.close()
            end(None, f"gpusched failed while relaying the call: {exc!r}")
        raise


async def _cut_by_unload(
    client: httpx.AsyncClient, claim: ClaimedJob, auth: Mapping[str, str]
) -> bool:
    """Whether llama-swap cut this call by unloading its model, the first
    time: its model no longer ready there (as the dispatcher judges its own
    jobs, queueapp/dispatch/forwarding.py). Nothing reached the caller yet."""
    try:
        answer = await client.get("/running", headers=dict(auth), timeout=5.0)
        still_ready = running_entries(answer.json()).get(claim.model) == READY
    except (httpx.HTTPError, ValueError):
        still_ready = False  # llama-swap itself went away with the model
    return not still_ready and not await db(job_was_cut_by_unload, gpu_path=True)(claim.job_id)


async def _after_caller_left(exchange: UpstreamExchange, end: _JobEnd) -> None:
    """A granted job's caller hung up: record it, then close the request to
    llama-swap (`close`: llama-server stops) or read its answer to the end
    and discard it (`drain`: a render goes on after its client left), and
    only then end the job, freeing the GPU. A caller that hung up after the
    stream's last event (`stream_ended`: clients close on `[DONE]`, which
    may come before llama-swap's end of the body) had its whole answer:
    the rest is read and the job succeeds."""
    if exchange.stream_ended and exchange.status is not None:
        with contextlib.suppress(Exception):
            await exchange.drain()
        answer = UpstreamAnswer(
            exchange.status, exchange.stream_type, bytes(exchange.transcript), None
        )
        end(answer, None)
        return
    left = (
        f"the caller disconnected after {exchange.relayed} bytes of the stream"
        if exchange.relayed
        else "the caller disconnected before llama-swap answered"
    )
    try:
        mode = await db(job_caller_left, gpu_path=True)(claim=end.claim)
    except DATABASE_ERRORS:
        mode = OnCallerGone.by_path(end.claim.path)  # the end's write is retried
    if mode is None:  # no longer this claim's job: nothing to hold the GPU for
        end.lease.stop()
        await exchange.close()
        return
    try:
        if mode == OnCallerGone.CLOSE or not exchange.in_flight:
            await exchange.close()
            outcome = left
        else:
            status, read = await exchange.drain()
            outcome = (
                f"{left}; llama-swap's answer (status {status}, {read} bytes more) was read "
                "to its end and discarded, the GPU held until then"
            )
    except Exception as exc:  # whatever broke the exchange, the job ends and frees the GPU
        outcome = f"{left}; the request to llama-swap broke off: {exc!r}"
    end(None, outcome, caller_gone=mode)


async def _relay_whole(
    exchange: UpstreamExchange,
    response: httpx.Response,
    upstream_type: str,
    headers: Headers,
    end: _JobEnd,
) -> Answer:
    """llama-swap's whole answer, read, then given to the caller."""
    try:
        content = await exchange.read()
    except httpx.HTTPError as exc:
        await exchange.close()
        end(None, f"the answer from llama-swap broke off: {exc!r}")
        return Answer.error(
            502, "llama-swap's answer broke off", "server_error", "upstream_error"
        ).with_headers(headers)
    end(UpstreamAnswer(response.status_code, upstream_type, content, None), None)
    return Answer(response.status_code, content, upstream_type, headers)


async def _relay_stream(
    exchange: UpstreamExchange,
    response: httpx.Response,
    upstream_type: str,
    headers: Headers,
    end: _JobEnd,
    reply: Reply,
) -> None:
    """llama-swap's stream, relayed chunk by chunk as it comes; its
    transcript is the job's result. After a waiting stream's comments the
    head is out already: the chunks follow them."""
    relayed = exchange.transcript
    exchange.stream_type = upstream_type
    await reply.start(
        response.status_code,
        [
            (b"content-type", upstream_type.encode("latin-1")),
            (b"cache-control", b"no-cache"),
            *headers,
        ],
    )
    try:
        while (chunk := await exchange.next_chunk()) is not None:
            relayed.extend(chunk)
            await reply.body(chunk)
    except httpx.HTTPError as exc:
        await exchange.close()
        end(None, f"llama-swap's stream broke off after {len(relayed)} bytes: {exc!r}")
    end(UpstreamAnswer(response.status_code, upstream_type, bytes(relayed), None), None)
    await reply.body(b"", more=False)
