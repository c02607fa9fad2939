"""A front-door call's admission: its request read and refused, or its job
queued and, when the GPU is idle and the score picks it, granted in the same
commit (no hop through the dispatcher). The claim itself is the
dispatcher's (queueapp/dispatch/claim.py).

A call names its band in `X-LlamaSwap-Priority`, or a `priority` in its JSON
body (the header wins); a body's `priority` is cut out of the bytes before
they travel, and every other byte stays untouched
(queueapp/policy/priority.py). A call that names no band gets its path's
(the policy's `priority_by_path`).

The key's check, the job's INSERT and the claim are one trip to the database
threads (`admit`). A refusal found without the database (the body, the
`X-Gpusched-Max-Wait` header) is told only to a caller whose key is good: an
anonymous call gets its 401. A job the forecast cannot start within the
caller's wait bound is refused (503 `gpu_busy`, nothing queued). Past
GPUSCHED_FRONT_DOOR_MAX_WAITING calls a process answers 429 and queues
nothing, its Retry-After the forecast's seconds until the first of its
waiting calls should leave.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import transaction

from queueapp.dispatch.claim import gateway_claim
from queueapp.dispatch.outcomes import ClaimedJob, claimed
from queueapp.errors import InvalidInput, QueueClosed, QueueLimitReached, WaitBoundUnmet
from queueapp.eta import seconds_until_first_start
from queueapp.frontdoor.answers import Answer, gpu_busy
from queueapp.frontdoor.authentication import login_refused, member_for, unauthorized
from queueapp.frontdoor.gateway import Grant, abandon, db, gateway
from queueapp.frontdoor.incoming_call import Call
from queueapp.job_body import body_problem, model_name_problem, stored_summary
from queueapp.logins import TooManyFailedLogins
from queueapp.models import Job, Member
from queueapp.policy.priority import BODY_FIELD, body_without_priority
from queueapp.policy.request_size import RequestSize, request_size
from queueapp.policy.wait_bound import MAX_WAIT_HEADER, WaitBoundInvalid, parse_max_wait_header
from queueapp.prepared import commit_without_flush_wait
from queueapp.services.jobs import job_queue
from queueapp.upstream.model_field import extract_model

# The waiting-limit 429's Retry-After is a forecast; one serves the refusals
# of this long, so a flood of refused calls costs one forecast a second.
WAITING_RETRY_CACHE_SECONDS = 1.0


@transaction.atomic(durable=True)
def job_submit_and_claim(
    *, gateway: int, worker: str, claim: bool = True, **submission: Any
) -> tuple[Job, ClaimedJob | None]:
    """A front-door call's job queued (`services.job_queue`, `submission` its
    arguments) and, in the same transaction and commit, `gateway_claim`:
    granted at once when the GPU is idle and the score picks it. `claim`
    False: the caller knows the GPU is busy; only the job is queued."""
    commit_without_flush_wait()  # the caller, waiting on its connection, is the durable party
    job = job_queue(gateway=gateway, front_door=True, **submission)
    if not claim:
        return job, None
    return job, claimed(gateway_claim(gateway=gateway, worker=worker, model=job.model))


@dataclass(frozen=True)
class CallBody:
    """What the front door takes from a call's body before it waits. The
    parsed body is dropped after this: a waiting call holds its raw bytes
    (`Call.body`, relayed as they came) and `stored`, a summary."""

    model: str
    # What the job stores (job_body.stored_summary; a form's content type
    # and size), and what the wait reads (`stream`).
    stored: dict[str, Any]
    priority_in_body: Any = None
    refusal: Answer | None = None
    # Read from the whole body, which the summary may cut (request_size.py).
    size: RequestSize | None = None


def read_body(call: Call, content_type: str) -> CallBody:
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
    size = request_size(call.path, parsed, body_bytes=len(call.body))
    return CallBody(model, stored, priority_in_body, refusal, size)


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


@dataclass(frozen=True)
class WaitBound:
    """The X-Gpusched-Max-Wait header's bound: the most seconds the job may
    wait for its start; `seconds` None when the call sets no bound."""

    seconds: float | None


def wait_bound(call: Call) -> WaitBound | Answer:
    """The bound the call asks for, or the 400 for a header that is not one."""
    try:
        return WaitBound(parse_max_wait_header(call.headers.get(MAX_WAIT_HEADER.lower())))
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


@dataclass(frozen=True)
class Queued:
    """Admitted: the call's job is queued (or granted already), and
    `waiting` resolves when it is granted or ends."""

    job: Job
    waiting: asyncio.Future[Grant]


@dataclass(frozen=True)
class AdmissionRefused:
    """Not admitted, nothing left queued: `answer` says why."""

    answer: Answer


@dataclass(frozen=True)
class AdmissionRequest:
    """What a call asks admission for, as the database threads take it."""

    authorization: str
    client: str
    path: str
    model: str
    body: dict[str, Any]  # as the job stores it (`CallBody.stored`)
    priority_header: str | None
    priority_in_body: Any
    max_wait: float | None  # seconds (`WaitBound`); None: no bound
    size: RequestSize | None  # `CallBody.size`


@dataclass(frozen=True)
class _Admitted:
    """What the admission's one database call came back with."""

    member: Member | None
    job: Job | None = None
    claim: ClaimedJob | None = None  # the GPU, when this gateway's caller won it at once
    # Refused for the waiting limit: the forecast's seconds until a waiting call leaves.
    retry_after: int | None = None


async def admit(
    call: Call, body: CallBody, bound: WaitBound | Answer, *, over_limit: bool
) -> Queued | AdmissionRefused:
    """Authenticate, queue the job and try the claim, in one trip to the
    database threads; `over_limit`: this process holds as many waiting
    calls as it may, and queues nothing."""
    # Told only to a caller whose key is good: an anonymous call gets its 401.
    refusal = body.refusal or (bound if isinstance(bound, Answer) else None)
    request = AdmissionRequest(
        authorization=call.headers.get("authorization", ""),
        client=call.client,
        path=call.path,
        model=body.model,
        body=body.stored,
        priority_header=call.headers.get("x-llamaswap-priority"),
        priority_in_body=body.priority_in_body,
        max_wait=bound.seconds if isinstance(bound, WaitBound) else None,
        size=body.size,
    )
    cached_retry = _waiting_retry.fresh() if over_limit else None
    if refusal is None and not over_limit:
        trip = db(_login_and_queue)(request)
    elif refusal is None and cached_retry is None:
        trip = db(_login_and_forecast)(request, gateway.waiting_job_ids())
    else:
        trip = db(_login)(request)
    admitting = asyncio.ensure_future(trip)
    try:
        admitted = await asyncio.shield(admitting)
    except asyncio.CancelledError:
        # The caller hung up while its job was being written: end that job.
        with contextlib.suppress(Exception):
            job = (await admitting).job
            if job is not None:
                await asyncio.shield(db(abandon)(job.pk, "the caller disconnected while queued"))
        raise
    except (
        TooManyFailedLogins,
        InvalidInput,
        QueueClosed,
        QueueLimitReached,
        WaitBoundUnmet,
    ) as exc:
        return AdmissionRefused(_refusal_answer(exc))
    if admitted.member is None:
        return AdmissionRefused(unauthorized())
    if admitted.job is None:
        if refusal is not None:
            return AdmissionRefused(refusal)
        if admitted.retry_after is not None:
            cached_retry = _waiting_retry.keep(admitted.retry_after)
        assert cached_retry is not None
        return AdmissionRefused(_over_waiting_limit(cached_retry))
    waiting = gateway.expect(admitted.job.pk)
    if admitted.claim is not None:
        gateway.hand_over(admitted.claim)
    return Queued(admitted.job, waiting)


def _refusal_answer(
    exc: TooManyFailedLogins | InvalidInput | QueueClosed | QueueLimitReached | WaitBoundUnmet,
) -> Answer:
    if isinstance(exc, TooManyFailedLogins):
        return login_refused(exc)
    if isinstance(exc, InvalidInput):
        return Answer.error(
            400,
            f"{exc.field}: {exc.message}",
            "invalid_request_error",
            "invalid_body",
            param=exc.field,
        )
    if isinstance(exc, QueueClosed):
        return Answer.error(503, exc.message, "server_error", "queue_closed", Retry_After="60")
    if isinstance(exc, QueueLimitReached):
        return Answer.error(
            429, exc.message, "rate_limit_error", "queue_limit", Retry_After=str(exc.retry_after)
        )
    return gpu_busy(exc)


# The admission's trips to the database threads: the key checked, and then
# the job queued, or (past the waiting limit) the forecast of when a waiting
# call should leave, or nothing (the call is refused either way).
def _login(request: AdmissionRequest) -> _Admitted:
    return _Admitted(member_for(request.authorization, request.client))


def _login_and_forecast(request: AdmissionRequest, waiting_jobs: list[int]) -> _Admitted:
    member = member_for(request.authorization, request.client)
    # Past the waiting limit: when the first waiting call should leave.
    retry = seconds_until_first_start(waiting_jobs) if member is not None else None
    return _Admitted(member, retry_after=retry)


def _login_and_queue(request: AdmissionRequest) -> _Admitted:
    member = member_for(request.authorization, request.client)
    if member is None:
        return _Admitted(member)
    assert gateway.number is not None  # the gateway listens before any call is admitted
    # Idle GPU and nobody better waiting: granted in the submission's own
    # commit, no hop. While one of this process's calls holds the GPU, it is
    # busy, and that call's end claims for the callers waiting here: a burst
    # of submissions then costs no claim attempts.
    job, claim = job_submit_and_claim(
        gateway=gateway.number,
        worker=gateway.worker,
        claim=gateway.claims_at_admission(),
        member=member,
        path=request.path,
        body=request.body,
        model=request.model,
        priority_header=request.priority_header,
        priority_in_body=request.priority_in_body,
        max_wait=request.max_wait,
        size=request.size,
    )
    return _Admitted(member, job, claim)
