"""The OpenAI-compatible front door: llama-swap's own paths, queued and scheduled.

A caller changes its base URL from llama-swap to gpusched and adds
`X-LlamaSwap-Priority`, or a `priority` in its JSON body (the header wins);
a body's `priority` is cut out of the bytes before they travel, and every
other byte stays untouched (queueapp/policy/priority.py). A call that names
no band gets its path's (the policy's `priority_by_path`). Each call
becomes a job (same scoring, audit, dashboard and `why`). The call waits, as a coroutine,
until its job is granted the GPU (queueapp/frontdoor/gateway.py); then this
process makes the upstream call itself under the job's lease (renewing it),
relays llama-swap's answer unchanged (status, content type, body;
server-sent events chunk by chunk as they arrive), and finishes the job with
what it relayed. A llama-swap that refuses connections gets a few tries;
then the job goes back to the queue, as the dispatcher's does, and the call
waits on its open connection for the next grant, on any GPU that can run it.

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
were a thousand threads and the pool ran out (503). Past
GPUSCHED_FRONT_DOOR_MAX_WAITING calls a process answers 429 and queues
nothing, its Retry-After the forecast's seconds until the first of its
waiting calls should leave.

`X-Gpusched-Max-Wait` bounds the wait: a job the forecast cannot start
within it is refused at admission (503 `gpu_busy`, nothing queued), and a
caller whose queued job expires gets the same 503 with the job's error.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
from django.conf import settings
from django.db import InterfaceError, OperationalError
from django.http.request import split_domain_port, validate_host

from queueapp.dispatch.claim import ClaimedJob
from queueapp.dispatch.lease import (
    job_caller_left,
    job_lease_renew,
    job_return_to_queue,
    lease_renew_interval,
)
from queueapp.errors import (
    DATABASE_ERRORS,
    DATABASE_RETRY_AFTER_SECONDS,
    DATABASE_UNAVAILABLE,
    SERVER_BUSY,
    SERVER_BUSY_RETRY_AFTER_SECONDS,
    InvalidInput,
    QueueClosed,
    QueueLimitReached,
    WaitBoundUnmet,
    pool_exhausted,
)
from queueapp.eta import seconds_until_first_start
from queueapp.frontdoor.admission import job_submit_and_claim
from queueapp.frontdoor.answers import Answer, Headers, Reply
from queueapp.frontdoor.exchange import UpstreamExchange
from queueapp.frontdoor.gateway import Grant, abandon, db, gateway
from queueapp.frontdoor.waiting import (
    Lines,
    comments_while_queued,
    granted_while_commenting,
    lines_for,
)
from queueapp.http_headers import retry_after_seconds
from queueapp.job_body import (
    body_problem,
    front_door_body_limit,
    model_name_problem,
    stored_summary,
)
from queueapp.logins import TooManyFailedLogins, member_login
from queueapp.models import Gpu, Job, JobStatus, Member, OnCallerGone
from queueapp.policy.priority import BODY_FIELD, body_without_priority
from queueapp.policy.wait_bound import MAX_WAIT_HEADER, WaitBoundInvalid, parse_max_wait_header
from queueapp.rendering import why_page_path
from queueapp.upstream.client import UpstreamAnswer, UpstreamUnreachable
from queueapp.upstream.model_field import extract_model

logger = logging.getLogger(__name__)

MODELS_PATH = "/v1/models"
UPSTREAM_RETRY_SECONDS = 1.0
# Connections the granted GPU's llama-swap may refuse in a row, retried
# UPSTREAM_RETRY_SECONDS apart, before the job goes back to the queue (the
# dispatcher returns its job at the first refusal: it has no caller to keep
# waiting). A llama-swap restarting to reload its config is back within
# that; one that stays down costs its caller a couple of seconds, not the
# whole wait, while another GPU could answer.
UPSTREAM_CONNECT_TRIES = 3
# The waiting-limit 429's Retry-After is a forecast; one serves the refusals
# of this long, so a flood of refused calls costs one forecast a second.
WAITING_RETRY_CACHE_SECONDS = 1.0

Send = Callable[[dict[str, Any]], Awaitable[None]]
Receive = Callable[[], Awaitable[dict[str, Any]]]


@dataclass
class Call:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    client: str
    body: bytes = b""

    @classmethod
    def from_scope(cls, scope: dict[str, Any]) -> Call:
        headers: dict[str, str] = {}
        for name, value in scope.get("headers", []):
            key = name.decode("latin-1").lower()
            text = value.decode("latin-1")
            headers[key] = f"{headers[key]},{text}" if key in headers else text
        client = scope.get("client") or ("unknown", 0)
        return cls(
            method=scope["method"],
            path=scope["path"],
            query=scope.get("query_string", b"").decode("latin-1"),
            headers=headers,
            client=str(client[0]),
        )


_upstreams: dict[tuple[asyncio.AbstractEventLoop, str], httpx.AsyncClient] = {}


def llama_swap_client(url: str) -> httpx.AsyncClient:
    """One client per GPU's llama-swap and event loop: its connections are
    reused from call to call."""
    key = (asyncio.get_running_loop(), url)
    client = _upstreams.get(key)
    if client is None:
        client = httpx.AsyncClient(
            base_url=url, timeout=httpx.Timeout(settings.GPUSCHED_JOB_TIMEOUT, connect=5)
        )
        _upstreams[key] = client
    return client


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


def _member_for(authorization: str, client: str) -> Member | None:
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None  # no key offered: not a guess to count
    return member_login(token=token, client=client)


def _login_refused(exc: TooManyFailedLogins) -> Answer:
    return Answer.error(
        429,
        exc.message,
        "rate_limit_error",
        "too_many_failed_logins",
        Retry_After=str(exc.retry_after),
    )


def _unauthorized() -> Answer:
    return Answer.error(
        401, "missing or invalid API key", "invalid_request_error", "invalid_api_key"
    )


async def _authenticate(call: Call) -> Member | Answer:
    """The caller, or the OpenAI-shaped refusal to answer with (401 or 429)."""
    try:
        member = await db(_member_for)(call.headers.get("authorization", ""), call.client)
    except TooManyFailedLogins as exc:
        return _login_refused(exc)
    return member if member is not None else _unauthorized()


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
        return await _list_models(call)
    if call.method != "POST":
        return Answer.error(
            405, f"{call.method} is not allowed here; use POST", "invalid_request_error"
        )
    content_type = call.headers.get("content-type", "")
    request = _read_request(call, content_type)
    model, body = request.model, request.stored
    max_wait = _max_wait(call)
    # Told only to a caller whose key is good: an anonymous call gets its 401.
    refusal = request.refusal or (max_wait if isinstance(max_wait, Answer) else None)
    over_limit = gateway.calls >= settings.GPUSCHED_FRONT_DOOR_MAX_WAITING
    await gateway.ready()
    gateway.calls += 1
    # Until the job is registered, a grant for an unknown job may be this one's.
    gateway.submitting += 1
    try:
        try:
            job, waiting = await _admit(
                call,
                refusal,
                over_limit=over_limit,
                model=model,
                body=body,
                priority_in_body=request.priority_in_body,
                max_wait=None if isinstance(max_wait, Answer) else max_wait,
            )
        finally:
            gateway.submitting -= 1
            gateway.release_unclaimed_grants()
        if isinstance(job, Answer):
            return job
        assert waiting is not None
        try:
            return await _wait_and_relay(call, reply, job, waiting, model, body, content_type)
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


@dataclass(frozen=True)
class _Request:
    """What the front door takes from a call's body before it waits. The
    parsed body is dropped after this: a waiting call holds its raw bytes
    (`Call.body`, relayed as they came) and `stored`, a summary."""

    model: str
    # What the job stores (job_body.stored_summary; a form's content type
    # and size), and what the wait reads (`stream`).
    stored: dict[str, Any]
    priority_in_body: Any = None
    refusal: Answer | None = None


def _read_request(call: Call, content_type: str) -> _Request:
    model, parsed = extract_model(content_type, call.body, call.query)
    priority_in_body = None
    if isinstance(parsed, dict) and BODY_FIELD in parsed:
        # llama-swap gets the body it would have got without gpusched.
        priority_in_body = parsed.pop(BODY_FIELD)
        call.body = body_without_priority(call.body)
    if isinstance(parsed, dict):
        stored = stored_summary(parsed)
    else:
        stored = {
            "model": model,
            "content_type": content_type.split(";")[0],
            "bytes": len(call.body),
        }
    refusal = _body_refused(model, parsed, content_type)
    return _Request(model, stored, priority_in_body, refusal)


# What HTTP forbids in a header's value (RFC 9110 5.5: controls but tab).
# Twisted takes it from the caller, httpx would not send it on to llama-swap.
_HEADER_FORBIDDEN = re.compile("[\x00-\x08\x0a-\x1f\x7f]")


def _body_refused(model: str, parsed: Any, content_type: str) -> Answer | None:
    if _HEADER_FORBIDDEN.search(content_type):
        return Answer.error(
            400,
            "Content-Type: contains a control character, which HTTP does not allow in a header",
            "invalid_request_error",
            "invalid_content_type",
        )
    if not model and parsed is None and "application/json" in content_type:
        return Answer.error(
            400, "the body is not valid JSON", "invalid_request_error", "invalid_json"
        )
    if not model:
        return Answer.error(
            400,
            "model: required (the model llama-swap should run)",
            "invalid_request_error",
            "model_required",
            param="model",
        )
    problem = model_name_problem(model)
    if problem:
        return Answer.error(
            400, f"model: {problem}", "invalid_request_error", "invalid_model", param="model"
        )
    # The whole body: llama-swap gets every byte, the summary stores some.
    problem = body_problem(parsed if isinstance(parsed, dict) else {"model": model})
    if problem:
        return Answer.error(400, f"body: {problem}", "invalid_request_error", "invalid_body")
    return None


def _max_wait(call: Call) -> float | None | Answer:
    """The X-Gpusched-Max-Wait header's bound (None: absent), or its 400."""
    try:
        return parse_max_wait_header(call.headers.get(MAX_WAIT_HEADER.lower()))
    except WaitBoundInvalid as exc:
        return Answer.error(
            400, f"{MAX_WAIT_HEADER}: {exc}", "invalid_request_error", "invalid_max_wait"
        )


def _over_waiting_limit(retry_after: int) -> Answer:
    limit = settings.GPUSCHED_FRONT_DOOR_MAX_WAITING
    return Answer.error(
        429,
        f"this server already holds {limit} waiting calls (GPUSCHED_FRONT_DOOR_MAX_WAITING); "
        "nothing was queued; try again when one has left (Retry-After: the forecast)",
        "rate_limit_error",
        "too_many_waiting",
        Retry_After=str(retry_after),
    )


class _WaitingRetry:
    """The waiting-limit 429's Retry-After: seconds until the first of this
    process's waiting calls is forecast to start, kept for
    WAITING_RETRY_CACHE_SECONDS."""

    def __init__(self) -> None:
        self.seconds = 0
        self.at = -WAITING_RETRY_CACHE_SECONDS

    def fresh(self) -> int | None:
        return self.seconds if time.monotonic() - self.at < WAITING_RETRY_CACHE_SECONDS else None

    def keep(self, seconds: int) -> int:
        self.seconds, self.at = seconds, time.monotonic()
        return seconds


_waiting_retry = _WaitingRetry()


def _gpu_busy(exc: WaitBoundUnmet) -> Answer:
    return Answer.error(
        503, exc.message, "server_error", exc.code, Retry_After=str(exc.retry_after)
    )


@dataclass(frozen=True)
class _Admitted:
    """What the admission's one database call came back with."""

    member: Member | None
    job: Job | None = None
    claim: ClaimedJob | None = None  # the GPU, when this gateway's caller won it at once
    # Refused for the waiting limit: the forecast's seconds until a waiting call leaves.
    retry_after: int | None = None


async def _admit(
    call: Call,
    refusal: Answer | None,
    *,
    over_limit: bool,
    model: str,
    body: dict[str, Any],
    priority_in_body: Any,
    max_wait: float | None,
) -> tuple[Job | Answer, asyncio.Future[Grant] | None]:
    """Authenticate, queue the job and try the claim, in one trip to the
    database threads; the job and the future its grant resolves, or the
    answer that refuses the call."""
    cached_retry = _waiting_retry.fresh() if over_limit else None
    admitting = asyncio.ensure_future(
        db(_authenticate_submit_claim)(
            authorization=call.headers.get("authorization", ""),
            client=call.client,
            submit=refusal is None and not over_limit,
            path=call.path,
            body=body,
            model=model,
            priority_header=call.headers.get("x-llamaswap-priority"),
            priority_in_body=priority_in_body,
            max_wait=max_wait,
            gateway_number=gateway.number,
            worker=gateway.worker,
            waiting_jobs=gateway.waiting_job_ids()
            if over_limit and refusal is None and cached_retry is None
            else None,
        )
    )
    try:
        admitted = await asyncio.shield(admitting)
    except asyncio.CancelledError:
        # The caller hung up while its job was being written: end that job.
        with contextlib.suppress(Exception):
            job = (await admitting).job
            if job is not None:
                await asyncio.shield(db(abandon)(job.pk, "the caller disconnected while queued"))
        raise
    except TooManyFailedLogins as exc:
        return _login_refused(exc), None
    except InvalidInput as exc:
        return Answer.error(
            400,
            f"{exc.field}: {exc.message}",
            "invalid_request_error",
            "invalid_body",
            param=exc.field,
        ), None
    except QueueClosed as exc:
        return Answer.error(
            503, exc.message, "server_error", "queue_closed", Retry_After="60"
        ), None
    except QueueLimitReached as exc:
        answer = Answer.error(
            429, exc.message, "rate_limit_error", "queue_limit", Retry_After=str(exc.retry_after)
        )
        return answer, None
    except WaitBoundUnmet as exc:
        return _gpu_busy(exc), None
    if admitted.member is None:
        return _unauthorized(), None
    if admitted.job is None:
        if refusal is not None:
            return refusal, None
        if admitted.retry_after is not None:
            cached_retry = _waiting_retry.keep(admitted.retry_after)
        assert cached_retry is not None
        return _over_waiting_limit(cached_retry), None
    waiting = gateway.expect(admitted.job.pk)
    if admitted.claim is not None:
        gateway.hand_over(admitted.claim)
    return admitted.job, waiting


def _authenticate_submit_claim(
    *,
    authorization: str,
    client: str,
    submit: bool,
    path: str,
    body: dict[str, Any],
    model: str,
    priority_header: str | None,
    priority_in_body: Any,
    max_wait: float | None,
    gateway_number: int | None,
    worker: str,
    waiting_jobs: list[int] | None,
) -> _Admitted:
    member = _member_for(authorization, client)
    if member is None or not submit:
        # Past the waiting limit: when the first waiting call should leave.
        retry = None
        if member is not None and waiting_jobs is not None:
            retry = seconds_until_first_start(waiting_jobs)
        return _Admitted(member, retry_after=retry)
    assert gateway_number is not None  # the gateway listens before any call is admitted
    # Idle GPU and nobody better waiting: granted in the submission's own
    # commit, no hop. While one of this process's calls holds the GPU, it is
    # busy, and that call's end claims for the callers waiting here: a burst
    # of submissions then costs no claim attempts.
    job, claim = job_submit_and_claim(
        gateway=gateway_number,
        worker=worker,
        claim=gateway.claims_at_admission(),
        member=member,
        path=path,
        body=body,
        model=model,
        priority_header=priority_header,
        priority_in_body=priority_in_body,
        max_wait=max_wait,
    )
    return _Admitted(member, job, claim)


async def _wait_and_relay(
    call: Call,
    reply: Reply,
    job: Job,
    waiting: asyncio.Future[Grant],
    model: str,
    body: dict[str, Any],
    content_type: str,
) -> Answer | None:
    """`body`: the request as its job stores it (`_Request.stored`)."""
    streaming = body.get("stream") is True
    # A waiting stream shows life: comment lines while queued (waiting.py).
    shown = (
        _Shown(reply, lines_for(call.path, call.headers, job_id=job.pk, model=model))
        if comments_while_queued(call.path, body)
        else None
    )
    given_back: str | None = None  # the claim token of the last grant this call gave back
    while True:
        grant = await _granted(job, waiting, given_back=given_back, shown=shown)
        if grant.status == JobStatus.EXPIRED:
            return _gpu_busy(await db(_expired_refusal)(job.pk)).with_headers(
                _job_headers(job, None)
            )
        if grant.status != JobStatus.RUNNING:
            return Answer.error(
                409,
                f"job {job.pk} was {grant.status} before it ran",
                "invalid_request_error",
                f"job_{grant.status}",
            ).with_headers(_job_headers(job, None))
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
        if (
            grant.lease_expires_at
            and grant.lease_expires_at - time.time() < claim.lease_seconds / 2
        ):
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
                ).with_headers(_job_headers(job, claim.effective_score))
        relayed = await _relay(call, reply, job, claim, content_type, streaming=streaming)
        if not isinstance(relayed, UpstreamUnreachable):
            return relayed
        # Armed before the return commits: a grant that follows at once (the
        # other GPU idle) finds this call waiting for it.
        waiting = gateway.expect(job.pk)
        if not await _give_back(job, claim, relayed):
            return Answer.error(
                502,
                f"llama-swap did not accept the connection ({relayed}), and job {job.pk}'s "
                "turn lapsed meanwhile",
                "server_error",
                "upstream_unreachable",
            ).with_headers(_job_headers(job, claim.effective_score))
        given_back = claim.claim_token


@dataclass(frozen=True)
class _Shown:
    """Where a waiting stream's lines go, and in which form."""

    reply: Reply
    lines: Lines


async def _granted(
    job: Job, waiting: asyncio.Future[Grant], *, given_back: str | None, shown: _Shown | None
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


async def _until_granted(job: Job, waiting: asyncio.Future[Grant], shown: _Shown | None) -> Grant:
    if shown is None or waiting.done():
        return await waiting
    return await granted_while_commenting(
        waiting,
        reply=shown.reply,
        headers=_job_headers(job, None),
        job_id=job.pk,
        board=gateway.statuses,
        interval=settings.GPUSCHED_STREAM_COMMENT_SECONDS,
        lines=shown.lines,
    )


async def _give_back(job: Job, claim: ClaimedJob, unreachable: UpstreamUnreachable) -> bool:
    """Return the job to the queue from the GPU whose llama-swap refused
    every connection; False when the job was no longer this claim's."""
    returning = asyncio.ensure_future(
        db(_job_return_unreachable, gpu_path=True)(claim=claim, error=str(unreachable))
    )
    try:
        return await asyncio.shield(returning)
    except asyncio.CancelledError:
        # The caller hung up as its job went back: cancel it once it is queued.
        with contextlib.suppress(Exception):
            await returning
        await asyncio.shield(db(abandon)(job.pk, "the caller disconnected while queued"))
        raise


def _expired_refusal(job_id: int) -> WaitBoundUnmet:
    """A queued job's bound passed: its error (what held the GPUs), and when
    the first GPU should free as the time to try again."""
    error = Job.objects.filter(pk=job_id).values_list("error", flat=True).first()
    return WaitBoundUnmet(
        f"job {job_id} expired: {error or 'its wait bound passed'}",
        retry_after=seconds_until_first_start([]),
    )


def _job_return_unreachable(*, claim: ClaimedJob, error: str) -> bool:
    """`job_return_to_queue`, its reason naming the GPU whose llama-swap refused."""
    gpus = Gpu.objects.filter(pk=claim.gpu_id) if claim.gpu_id is not None else Gpu.objects.none()
    gpu = gpus.values_list("name", flat=True).first()
    where = f"{gpu} ({claim.upstream_url})" if gpu else claim.upstream_url
    return job_return_to_queue(claim=claim, reason=f"llama-swap unreachable at {where}: {error}")


def _job_headers(job: Job, score: float | None) -> Headers:
    """Every answer that belongs to a job says which job, and how it was ranked."""
    return [
        (b"x-gpusched-job-id", str(job.pk).encode()),
        (b"x-gpusched-priority-requested", str(job.priority_requested).encode()),
        (b"x-gpusched-priority-applied", str(job.priority).encode()),
        (b"x-gpusched-score", f"{score:.6g}".encode() if score is not None else b""),
        (b"x-gpusched-why", why_page_path(job.pk).encode()),
    ]


async def _list_models(call: Call) -> Answer:
    """`GET /v1/models`: llama-swap's list relayed; with several GPUs, every
    GPU's list merged (each model once, as the first GPU that answers lists it)."""
    member = await _authenticate(call)
    if not isinstance(member, Member):
        return member
    await gateway.ready()  # the registered GPUs are read as it starts
    urls = sorted(set(gateway.gpu_urls.values())) or [await gateway.upstream_url(None)]
    answers = await asyncio.gather(
        *(llama_swap_client(url).get(MODELS_PATH, timeout=10) for url in urls),
        return_exceptions=True,
    )
    relayed = [a for a in answers if isinstance(a, httpx.Response)]
    if not relayed:
        return Answer.error(
            503, "llama-swap is unreachable", "server_error", "upstream_unreachable"
        )
    if len(urls) == 1:
        only = relayed[0]
        return Answer(
            only.status_code, only.content, only.headers.get("content-type", "application/json")
        )
    merged: dict[str, Any] = {}
    for answer in relayed:
        with contextlib.suppress(ValueError, AttributeError, TypeError):
            for entry in answer.json().get("data") or []:
                merged.setdefault(str(entry.get("id")), entry)
    body = {"object": "list", "data": [merged[model] for model in sorted(merged)]}
    return Answer(200, json.dumps(body).encode(), "application/json")


class _Lease:
    """Renews the granted job's lease while this call uses the GPU."""

    def __init__(self, claim: ClaimedJob) -> None:
        self.claim = claim
        self._task: asyncio.Task | None = None

    async def _renew(self) -> None:
        while True:
            await asyncio.sleep(lease_renew_interval(self.claim.lease_seconds))
            await db(job_lease_renew, gpu_path=True)(claim=self.claim)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._renew())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()


async def _send_upstream(exchange: UpstreamExchange) -> httpx.Response:
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


async def _relay(
    call: Call, reply: Reply, job: Job, claim: ClaimedJob, content_type: str, *, streaming: bool
) -> Answer | UpstreamUnreachable | None:
    """The call made under the job's lease and its answer relayed (None: sent
    as a stream already); UpstreamUnreachable: nothing was sent, the lease is
    no longer renewed, and the job is the caller's to give back."""
    lease = _Lease(claim)
    lease.start()
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

    def __init__(self, claim: ClaimedJob, lease: _Lease) -> None:
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
    lease: _Lease,
    streaming: bool,
) -> Answer | UpstreamUnreachable | None:
    headers = _job_headers(job, claim.effective_score)
    end = _JobEnd(claim, lease)
    exchange: UpstreamExchange | None = None
    try:
        client = llama_swap_client(claim.upstream_url)
        # The caller's Content-Type as its bytes came (latin-1 both ways):
        # httpx would refuse a non-ASCII value as text.
        request = client.build_request(
            "POST",
            claim.path,
            content=call.body,
            headers=[(b"content-type", content_type.encode("latin-1"))],
        )
        exchange = UpstreamExchange(client, request)
        try:
            response = await _send_upstream(exchange)
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
