"""The OpenAI-compatible front door: llama-swap's own paths, queued and scheduled.

A caller changes its base URL from llama-swap to gpusched and adds
`X-LlamaSwap-Priority`; the body stays untouched. Each call becomes a job
(same scoring, audit, dashboard and `why`). The connection waits while the
job is queued; when the dispatcher grants it the GPU, this connection makes
the upstream call itself under the job's lease (renewing it), relays
llama-swap's answer unchanged (status, content type, body; server-sent events
chunk by chunk as they arrive), then finishes the job with what it relayed.

A caller that disconnects while queued cancels its job; one that disconnects
while its job runs ends it as failed, with the reason.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import close_old_connections
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

from queueapp import services
from queueapp.dispatch.claim import ClaimedJob, job_finish, job_lease_renew
from queueapp.errors import Conflict, InvalidInput, QueueClosed, QueueLimitReached
from queueapp.logins import TooManyFailedLogins, client_address, member_login
from queueapp.models import DispatchDecision, Job, JobStatus, Member
from queueapp.selectors import policy_get
from queueapp.upstream.client import FORWARDED_PATHS, UpstreamAnswer
from queueapp.upstream.model_field import extract_model

FRONT_DOOR_PATHS = (*FORWARDED_PATHS, "/v1/audio/transcriptions")
GRANT_POLL_SECONDS = 0.05
UPSTREAM_RETRY_SECONDS = 1.0


def openai_error(
    status: int, message: str, error_type: str, code: str | None = None, **headers: str
) -> JsonResponse:
    response = JsonResponse(
        {"error": {"message": message, "type": error_type, "param": None, "code": code}},
        status=status,
    )
    for name, value in headers.items():
        response[name.replace("_", "-")] = value
    return response


def _member_for(authorization: str, client: str) -> Member | None:
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None  # no key offered: not a guess to count
    return member_login(token=token, client=client)


async def _authenticate(request: HttpRequest) -> Member | JsonResponse:
    """The caller, or the OpenAI-shaped refusal to answer with (401 or 429)."""
    try:
        member = await sync_to_async(_member_for)(
            request.headers.get("Authorization", ""), client_address(request.META)
        )
    except TooManyFailedLogins as exc:
        return openai_error(
            429,
            exc.message,
            "rate_limit_error",
            "too_many_failed_logins",
            Retry_After=str(exc.retry_after),
        )
    if member is None:
        return openai_error(
            401, "missing or invalid API key", "invalid_request_error", "invalid_api_key"
        )
    return member


@csrf_exempt
async def list_models(request: HttpRequest) -> HttpResponse:
    """`GET /v1/models`, relayed from llama-swap."""
    caller = await _authenticate(request)
    if not isinstance(caller, Member):
        return caller
    async with httpx.AsyncClient(base_url=settings.LLAMA_SWAP_URL, timeout=10) as client:
        try:
            answer = await client.get("/v1/models")
        except httpx.TransportError:
            return openai_error(
                503, "llama-swap is unreachable", "server_error", "upstream_unreachable"
            )
    return HttpResponse(
        answer.content, status=answer.status_code, content_type=answer.headers.get("content-type")
    )


@csrf_exempt
async def front_door(request: HttpRequest) -> HttpResponse:
    if request.method != "POST":
        return openai_error(
            405, f"{request.method} is not allowed here; use POST", "invalid_request_error"
        )
    member = await _authenticate(request)
    if not isinstance(member, Member):
        return member
    raw = request.body
    limit = settings.GPUSCHED_MAX_BODY_BYTES
    if len(raw) > limit:
        return openai_error(
            400,
            f"the request is {len(raw)} bytes; the limit is {limit}",
            "invalid_request_error",
            "request_too_large",
        )
    content_type = request.headers.get("Content-Type", "")
    model, parsed = extract_model(content_type, raw, request.META.get("QUERY_STRING", ""))
    if not model and parsed is None and "application/json" in content_type:
        return openai_error(
            400, "the body is not valid JSON", "invalid_request_error", "invalid_json"
        )
    if not model:
        return openai_error(
            400,
            "model: required (the model llama-swap should run)",
            "invalid_request_error",
            "model_required",
        )
    body = (
        parsed
        if isinstance(parsed, dict)
        else {"model": model, "content_type": content_type.split(";")[0], "bytes": len(raw)}
    )
    try:
        job = await sync_to_async(services.job_submit)(
            member=member,
            path=request.path,
            body=body,
            model=model,
            priority_header=request.headers.get("X-LlamaSwap-Priority"),
            front_door=True,
        )
    except InvalidInput as exc:
        return openai_error(
            400, f"{exc.field}: {exc.message}", "invalid_request_error", "invalid_body"
        )
    except QueueClosed as exc:
        return openai_error(503, exc.message, "server_error", "queue_closed", Retry_After="60")
    except QueueLimitReached as exc:
        return openai_error(
            429, exc.message, "rate_limit_error", "queue_limit", Retry_After=str(exc.retry_after)
        )
    try:
        claim = await _wait_for_grant(job.pk)
    except asyncio.CancelledError:
        # The caller hung up while queued: nothing ran, nothing is left behind.
        await asyncio.shield(
            sync_to_async(_abandon)(job.pk, "the caller disconnected while queued")
        )
        raise
    if claim is None:
        job = await sync_to_async(Job.objects.get)(pk=job.pk)
        refusal = openai_error(
            409,
            f"job {job.pk} was {job.status} before it ran",
            "invalid_request_error",
            "job_" + job.status,
        )
        return _with_job_headers(refusal, job)
    streaming = isinstance(parsed, dict) and parsed.get("stream") is True
    return await _relay(job.pk, claim, raw, content_type, streaming=streaming)


async def _wait_for_grant(job_id: int) -> ClaimedJob | None:
    """Wait until the dispatcher grants this job the GPU (None if it ended first)."""
    while True:
        row = await sync_to_async(_job_row)(job_id)
        if row["status"] == JobStatus.RUNNING:
            return ClaimedJob(
                job_id=job_id,
                path=row["path"],
                body=None,
                model=row["model"],
                claim_token=row["lease_owner"],
                lease_seconds=(await sync_to_async(policy_get)()).lease_seconds,
                # So the learned durations tell warm runs from runs with a swap.
                swap_needed=await sync_to_async(_swap_needed)(job_id),
                granted=True,
            )
        if row["status"] != JobStatus.QUEUED:
            return None
        await asyncio.sleep(GRANT_POLL_SECONDS)


def _job_row(job_id: int) -> dict[str, Any]:
    return Job.objects.values("status", "lease_owner", "path", "model").get(pk=job_id)


def _swap_needed(job_id: int) -> bool:
    decision = DispatchDecision.objects.filter(job_id=job_id).order_by("-id").first()
    return bool(decision and decision.swap_needed)


def _abandon(job_id: int, reason: str) -> None:
    """The caller is gone: cancel a queued job, or end a granted one as failed."""
    close_old_connections()
    job = Job.objects.get(pk=job_id)
    if job.status == JobStatus.QUEUED:
        try:
            services.job_cancel(job=job, by=f"front door: {reason}")
            return
        except Conflict:  # granted meanwhile
            job = Job.objects.get(pk=job_id)
    if job.status == JobStatus.RUNNING:
        claim = ClaimedJob(job.pk, job.path, None, job.model, job.lease_owner, 0, False, True)
        job_finish(claim=claim, answer=None, error=reason, inline_limit=0, caller_gone=True)


class _Lease:
    """Renews the granted job's lease while this connection uses the GPU."""

    def __init__(self, claim: ClaimedJob) -> None:
        self.claim = claim
        self._task: asyncio.Task | None = None

    async def _renew(self) -> None:
        while True:
            await asyncio.sleep(max(0.2, self.claim.lease_seconds / 3))
            await sync_to_async(job_lease_renew)(claim=self.claim)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._renew())

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()


def _with_job_headers(response: HttpResponse, job: Job) -> HttpResponse:
    """Every answer that belongs to a job says which job, and how it was ranked."""
    score = (job.score_at_dispatch or {}).get("effective")
    response["X-Gpusched-Job-Id"] = str(job.pk)
    response["X-Gpusched-Priority-Requested"] = str(job.priority_requested)
    response["X-Gpusched-Priority-Applied"] = str(job.priority)
    response["X-Gpusched-Score"] = f"{score:.6g}" if score is not None else ""
    response["X-Gpusched-Why"] = f"/jobs/{job.pk}/why/"
    return response


async def _send_upstream(client: httpx.AsyncClient, request: httpx.Request) -> httpx.Response:
    """Send the body; llama-swap down or busy with another client means wait
    and try again: this connection holds the GPU, nothing else could run."""
    while True:
        try:
            response = await client.send(request, stream=True)
        except (httpx.ConnectError, httpx.ConnectTimeout):
            await asyncio.sleep(UPSTREAM_RETRY_SECONDS)
            continue
        if response.status_code != 429:
            return response
        await response.aclose()
        retry = response.headers.get("retry-after", "")
        await asyncio.sleep(
            float(retry) if retry.replace(".", "", 1).isdigit() else UPSTREAM_RETRY_SECONDS
        )


async def _relay(
    job_id: int, claim: ClaimedJob, raw: bytes, content_type: str, *, streaming: bool
) -> HttpResponse:
    lease = _Lease(claim)
    lease.start()
    client = httpx.AsyncClient(
        base_url=settings.LLAMA_SWAP_URL,
        timeout=httpx.Timeout(settings.GPUSCHED_JOB_TIMEOUT, connect=5),
    )
    request = client.build_request(
        "POST", claim.path, content=raw, headers={"Content-Type": content_type}
    )
    finished = False

    async def finish(answer: UpstreamAnswer | None, error: str | None) -> None:
        nonlocal finished
        if finished:
            return
        finished = True
        lease.stop()
        await asyncio.shield(
            sync_to_async(job_finish)(
                claim=claim,
                answer=answer,
                error=error,
                inline_limit=settings.GPUSCHED_RESULT_INLINE_BYTES,
            )
        )

    try:
        response = await _send_upstream(client, request)
    except asyncio.CancelledError:
        lease.stop()
        await client.aclose()
        await asyncio.shield(
            sync_to_async(_abandon)(job_id, "the caller disconnected before llama-swap answered")
        )
        raise
    except httpx.HTTPError as exc:
        await client.aclose()
        await finish(None, f"the call to llama-swap failed: {exc!r}")
        job = await sync_to_async(Job.objects.get)(pk=job_id)
        return _with_job_headers(
            openai_error(502, "llama-swap did not answer", "server_error", "upstream_error"), job
        )
    job = await sync_to_async(Job.objects.get)(pk=job_id)
    upstream_type = response.headers.get("content-type", "application/octet-stream")

    if not streaming or "text/event-stream" not in upstream_type:
        try:
            content = await response.aread()
        except asyncio.CancelledError:
            await client.aclose()
            await finish(None, "the caller disconnected before llama-swap answered")
            raise
        except httpx.HTTPError as exc:
            await client.aclose()
            await finish(None, f"the answer from llama-swap broke off: {exc!r}")
            broken = openai_error(
                502, "llama-swap's answer broke off", "server_error", "upstream_error"
            )
            return _with_job_headers(broken, job)
        await client.aclose()
        await finish(UpstreamAnswer(response.status_code, upstream_type, content, None), None)
        reply = HttpResponse(content, status=response.status_code, content_type=upstream_type)
        return _with_job_headers(reply, job)

    async def chunks() -> AsyncIterator[bytes]:
        relayed = bytearray()
        try:
            async for chunk in response.aiter_raw():
                relayed.extend(chunk)
                yield chunk
        except httpx.HTTPError as exc:
            await finish(None, f"llama-swap's stream broke off after {len(relayed)} bytes: {exc!r}")
            return
        except (asyncio.CancelledError, GeneratorExit):
            await finish(None, f"the caller disconnected after {len(relayed)} bytes of the stream")
            raise
        finally:
            await response.aclose()
            await client.aclose()
            # The transcript of the stream is the job's result.
            await finish(
                UpstreamAnswer(response.status_code, upstream_type, bytes(relayed), None), None
            )

    reply = StreamingHttpResponse(chunks(), status=response.status_code, content_type=upstream_type)
    reply["Cache-Control"] = "no-cache"
    return _with_job_headers(reply, job)
