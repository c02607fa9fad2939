"""Thin views: validate input, call a service or selector, render."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.http import FileResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from queueapp import rendering, selectors, services
from queueapp.api.auth import signed_in_member
from queueapp.api.documented import (
    ERROR_ANSWERS,
    PRIORITY_HEADER,
    answers,
    max_wait_parameter,
    priority_parameter,
    retry_after_header,
    submitted_headers,
)
from queueapp.api.inputs import (
    JobSubmitInput,
    PolicySerializer,
    PreloadInput,
)
from queueapp.api.schema import (
    ChainCancelOutput,
    ChainListOutput,
    ChainOutput,
    ErrorOutput,
    HealthOutput,
    JobListOutput,
    JobOutput,
    MeOutput,
    QueueOutput,
    StatsOutput,
)
from queueapp.api.schema_why import WhyOutput, as_of_parameter
from queueapp.chain_summaries import chain_summaries
from queueapp.dashboard import (
    QUEUE_PAGE_DEPTH,
    QUEUE_VIEW_LIMIT,
    QueuePage,
    queue_state,
    state_for,
)
from queueapp.errors import InvalidInput, NotFound, RequestTooLarge
from queueapp.eta import queue_forecast_for
from queueapp.job_body import REST_ENVELOPE_BYTES, body_problem, rest_body_limit
from queueapp.models import Gpu, Job, JobStatus
from queueapp.policy.concurrency import parallels_over_limit
from queueapp.policy.wait_bound import (
    MAX_WAIT_HEADER,
    WaitBoundInvalid,
    parse_max_wait_header,
)
from queueapp.rendering import GpuHealth, gpu_health
from queueapp.selectors import JobsWithWebhooks
from queueapp.webhooks.delivery import webhook_redeliver
from queueapp.why import job_why


def max_wait_of(raw: str | None) -> float | None:
    """The X-Gpusched-Max-Wait header's bound; a 400 naming the header otherwise."""
    try:
        return parse_max_wait_header(raw)
    except WaitBoundInvalid as exc:
        raise InvalidInput(str(exc), field=MAX_WAIT_HEADER) from None


class ApiView(APIView):
    """Refuses query parameters it does not know, as inputs refuse unknown
    fields: `?stauts=queued` is a 400 that names it, not a filter ignored."""

    query_parameters: tuple[str, ...] = ()

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)  # authentication first: 401 before 400
        unknown = sorted(set(request.query_params) - set(self.query_parameters))
        if unknown:
            raise InvalidInput(
                "unknown query parameter"
                + (
                    f"; this call takes {', '.join(self.query_parameters)}"
                    if self.query_parameters
                    else ""
                ),
                field=unknown[0][:100],
            )


class IsStaffMember:
    message = "staff only"

    def has_permission(self, request: Request, view: APIView) -> bool:
        return bool(request.user and getattr(request.user, "is_staff", False))

    def has_object_permission(self, request: Request, view: APIView, obj: Any) -> bool:
        return self.has_permission(request, view)


def site_url(request: Request) -> str:
    """The site the caller reached, for the links in an answer."""
    return request.build_absolute_uri("/")


def render_jobs(page: JobsWithWebhooks, request: Request) -> list[dict[str, Any]]:
    """Jobs as `GET /api/jobs/{id}/` shows them; one queue forecast places
    every queued one."""
    forecast, page = queue_forecast_for(page)
    base_url = site_url(request)
    return [
        rendering.job_with_forecast(
            job, base_url=base_url, forecast=forecast, deliveries=page.webhook_log(job.pk)
        )
        for job in page.jobs
    ]


def render_job(job: Job, request: Request) -> dict[str, Any]:
    return render_jobs(selectors.jobs_with_webhooks([job]), request)[0]


class JobListCreateView(ApiView):
    query_parameters = ("status",)

    @extend_schema(
        request=JobSubmitInput,
        responses=answers({201: JobOutput}, 400, 413, 415, 503),
        parameters=[
            priority_parameter,
            max_wait_parameter,
            *submitted_headers,
            retry_after_header,
        ],
        summary="Submit a job",
    )
    def post(self, request: Request) -> Response:
        length = int(request.META.get("CONTENT_LENGTH") or 0)
        limit = rest_body_limit()
        if length > limit.bytes + REST_ENVELOPE_BYTES:
            raise RequestTooLarge(limit.refusal(length, request.path), field="body")
        payload = JobSubmitInput(data=request.data)
        payload.is_valid(raise_exception=True)
        data = payload.validated_data
        max_wait = max_wait_of(request.headers.get(MAX_WAIT_HEADER))
        member = signed_in_member(request)
        job = services.job_submit(
            member=member,
            path=data["path"],
            body=data["body"],
            model=data["body"]["model"],
            priority_header=request.headers.get(PRIORITY_HEADER),
            priority_in_body=data.get("priority"),
            callback_url=data.get("callback_url") or "",
            chain=data.get("chain"),
            max_wait=max_wait,
        )
        return submitted(job, request)

    @extend_schema(
        responses=answers({200: JobListOutput}, 400),
        parameters=[
            retry_after_header,
            OpenApiParameter(
                "status", OpenApiTypes.STR, enum=JobStatus.values, description="Filter by status."
            ),
        ],
        summary="The caller's most recent jobs",
        operation_id="jobs_list",
    )
    def get(self, request: Request) -> Response:
        wanted = request.query_params.get("status")
        if wanted is not None and wanted not in JobStatus.values:
            raise InvalidInput(f"one of {', '.join(JobStatus.values)}", field="status")
        page = selectors.job_list_for_member(member=signed_in_member(request), status=wanted)
        return Response({"results": render_jobs(page, request)})


def submitted(job: Job, request: Request) -> Response:
    """A new job's 201: the job, the priority asked for and applied, its place."""
    response = Response(render_job(job, request), status=status.HTTP_201_CREATED)
    response["X-Gpusched-Priority-Requested"] = str(job.priority_requested)
    response["X-Gpusched-Priority-Applied"] = str(job.priority)
    response["Location"] = f"/api/jobs/{job.pk}/"
    return response


class PreloadView(ApiView):
    @extend_schema(
        request=PreloadInput,
        responses=answers({201: JobOutput}, 400, 415, 503),
        parameters=[priority_parameter, *submitted_headers, retry_after_header],
        summary="Load a model ahead of use",
        description="Queues a job that only loads the model (llama-swap's GET "
        "/upstream/{model}/), at -100 (background) unless the header or `priority` "
        "names another; a job whose model is loaded already goes ahead of it. With "
        "`gpu`, only that GPU runs it (400 for a GPU unknown, disabled or not running "
        "the model). Its path "
        "is /upstream/{model}/; it ends at once, without a call, when the model is "
        "resident as it starts.",
    )
    def post(self, request: Request) -> Response:
        payload = PreloadInput(data=request.data)
        payload.is_valid(raise_exception=True)
        data = payload.validated_data
        job = services.job_preload(
            member=signed_in_member(request),
            model=data["model"],
            priority_header=request.headers.get(PRIORITY_HEADER),
            priority_in_body=data.get("priority"),
            gpu=data.get("gpu") or "",
            callback_url=data.get("callback_url") or "",
        )
        return submitted(job, request)


class JobDetailView(ApiView):
    @extend_schema(
        parameters=[retry_after_header],
        responses=answers({200: JobOutput}, 404),
        summary="A job, its score and result",
    )
    def get(self, request: Request, job_id: int) -> Response:
        job = selectors.job_get_for_member(job_id=job_id, member=signed_in_member(request))
        return Response(render_job(job, request))

    @extend_schema(
        parameters=[retry_after_header],
        responses=answers({200: JobOutput}, 404, 409),
        summary="Cancel a queued job",
    )
    def delete(self, request: Request, job_id: int) -> Response:
        job = selectors.job_get_for_member(job_id=job_id, member=signed_in_member(request))
        job = services.job_cancel(job=job, by=signed_in_member(request).name)
        return Response(render_job(job, request))


class JobResultView(ApiView):
    @extend_schema(
        parameters=[retry_after_header],
        responses=answers({(200, "*/*"): OpenApiTypes.BINARY}, 404),
        summary="A stored result file",
    )
    def get(self, request: Request, job_id: int) -> FileResponse:
        job = selectors.job_get_for_member(job_id=job_id, member=signed_in_member(request))
        if not job.result_file:
            raise NotFound(f"job {job_id} has no stored result file")
        return FileResponse(
            job.result_file.open("rb"),
            content_type=job.result_content_type or "application/octet-stream",
        )


class QueueView(ApiView):
    query_parameters = ("offset", "limit")

    @extend_schema(
        parameters=[
            retry_after_header,
            OpenApiParameter(
                "offset",
                {"type": "integer", "minimum": 0, "maximum": QUEUE_PAGE_DEPTH - 1},
                description="Queued jobs to skip, in dispatch order (default 0).",
            ),
            OpenApiParameter(
                "limit",
                {"type": "integer", "minimum": 1, "maximum": QUEUE_VIEW_LIMIT},
                description=f"Queued jobs to list (default {QUEUE_VIEW_LIMIT}); a page "
                f"ends at position {QUEUE_PAGE_DEPTH}, the forecast's reach.",
            ),
        ],
        responses=answers({200: QueueOutput}, 400),
        summary="Running job and queue order",
    )
    def get(self, request: Request) -> Response:
        page = QueuePage.parse(
            offset=request.query_params.get("offset"), limit=request.query_params.get("limit")
        )
        return Response(state_for(queue_state(page), signed_in_member(request)))


class JobWhyView(ApiView):
    query_parameters = ("as_of",)

    @extend_schema(
        parameters=[as_of_parameter, retry_after_header],
        responses=answers({200: WhyOutput}, 400, 404),
        summary="Why the job waited",
    )
    def get(self, request: Request, job_id: int) -> Response:
        member = signed_in_member(request)
        job = selectors.job_get_for_member(job_id=job_id, member=member)
        as_of = selectors.job_why_as_of(job=job, raw=request.query_params.get("as_of"))
        return Response(job_why(job=job, viewer=member, as_of=as_of))


class WebhookRedeliverView(ApiView):
    @extend_schema(
        request=None,
        parameters=[retry_after_header],
        responses=answers({202: JobOutput}, 404),
        summary="Send the job's last webhook again",
    )
    def post(self, request: Request, job_id: int) -> Response:
        job = selectors.job_get_for_member(job_id=job_id, member=signed_in_member(request))
        delivery = selectors.webhook_delivery_latest(job=job)
        if delivery is None:
            raise NotFound(f"job {job_id} has no webhook delivery")
        webhook_redeliver(delivery=delivery)
        return Response(render_job(job, request), status=status.HTTP_202_ACCEPTED)


class StatsView(ApiView):
    query_parameters = ("window",)

    @extend_schema(
        parameters=[
            retry_after_header,
            OpenApiParameter("window", OpenApiTypes.STR, enum=list(selectors.STATS_WINDOWS)),
        ],
        responses=answers({200: StatsOutput}, 400),
        summary="Per-band figures: depth, longest wait, dispatches, order changed by each term",
    )
    def get(self, request: Request) -> Response:
        window = request.query_params.get("window", "hour")
        if window not in selectors.STATS_WINDOWS:
            raise InvalidInput(f"one of {', '.join(selectors.STATS_WINDOWS)}", field="window")
        return Response({"window": window, "bands": selectors.band_stats(window=window)})


class ChainListView(ApiView):
    @extend_schema(
        parameters=[retry_after_header],
        responses=answers({200: ChainListOutput}),
        summary="The caller's chains",
        operation_id="chains_list",
    )
    def get(self, request: Request) -> Response:
        return Response({"results": chain_summaries(member=signed_in_member(request))})


class ChainDetailView(ApiView):
    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)
        chain_id = kwargs["chain_id"]
        # No stored chain has such an id (200 characters at most, no NUL, which
        # PostgreSQL text cannot hold): not found, without asking the database.
        if len(chain_id) > 200 or body_problem(chain_id):
            raise NotFound("chain not found")

    @extend_schema(
        parameters=[retry_after_header],
        responses=answers({200: ChainOutput}, 404),
        summary="A chain's progress",
    )
    def get(self, request: Request, chain_id: str) -> Response:
        found = chain_summaries(member=signed_in_member(request), chain_id=chain_id)
        if not found:
            raise NotFound("chain not found")
        return Response(found[0])

    @extend_schema(
        parameters=[retry_after_header],
        responses=answers({200: ChainCancelOutput}, 404),
        summary="Cancel a chain's queued units",
    )
    def delete(self, request: Request, chain_id: str) -> Response:
        cancelled = services.chain_cancel(
            member=signed_in_member(request), chain_id=chain_id, by=signed_in_member(request).name
        )
        return Response({"id": chain_id, "cancelled": cancelled})


class MeView(ApiView):
    @extend_schema(
        parameters=[retry_after_header], responses=answers({200: MeOutput}), summary="The caller"
    )
    def get(self, request: Request) -> Response:
        return Response(MeOutput(signed_in_member(request)).data)


class PolicyView(ApiView):
    def get_permissions(self) -> Sequence[Any]:
        if self.request.method == "PATCH":
            return [*super().get_permissions(), IsStaffMember()]
        return super().get_permissions()

    @extend_schema(
        parameters=[retry_after_header],
        responses=answers({200: PolicySerializer}),
        summary="The scheduling policy",
    )
    def get(self, request: Request) -> Response:
        return Response(PolicySerializer(selectors.policy_get()).data)

    @extend_schema(
        request=PolicySerializer,
        parameters=[retry_after_header],
        responses=answers({200: PolicySerializer}, 400, 403, 415),
        summary="Change the policy (staff)",
    )
    def patch(self, request: Request) -> Response:
        payload = PolicySerializer(selectors.policy_get(), data=request.data, partial=True)
        payload.is_valid(raise_exception=True)
        policy = services.policy_update(changes=dict(payload.validated_data))
        return Response(PolicySerializer(policy).data)


class HealthView(ApiView):
    permission_classes = [AllowAny]
    authentication_classes: list[Any] = []

    @extend_schema(
        responses={
            200: HealthOutput,
            400: OpenApiResponse(ErrorOutput, description=ERROR_ANSWERS[400]),
            503: HealthOutput,
        },
        summary="Database, llama-swap and queue health",
    )
    def get(self, request: Request) -> Response:
        try:
            gpus = selectors.gpus_list()
            running = selectors.running_jobs_by_gpu()
            parallel = selectors.model_parallels()
            queue = selectors.job_counts_by_status(JobStatus.QUEUED, JobStatus.RUNNING)
        except Exception as exc:  # the database is what is down
            return Response(
                {"status": "down", "database": f"unavailable: {type(exc).__name__}"},
                status=status.HTTP_503_SERVICE_UNAVAILABLE,
            )
        # Degraded when an enabled GPU's llama-swap did not answer its last
        # check (or refused gpusched's API key); each such GPU named, with why.
        unhealthy = [
            gpu for gpu in gpus if gpu_health(gpu) in (GpuHealth.DOWN, GpuHealth.NO_DISPATCHER)
        ]
        # And when its llama-swap config cannot be used: the line names the GPU.
        routing_errors = [gpu.routing_error for gpu in gpus if gpu.enabled and gpu.routing_error]
        # And when a model's parallel is above its concurrencyLimit there.
        configs = Gpu.routing_configs([gpu for gpu in gpus if gpu.enabled])
        set_by_operator = selectors.operator_parallels()
        routing_errors += [str(over) for over in parallels_over_limit(configs, set_by_operator)]
        first = gpus[0] if gpus else None
        return Response(
            {
                "status": "degraded" if unhealthy or routing_errors else "ok",
                "database": "ok",
                "problems": [_gpu_problem(gpu) for gpu in unhealthy] + routing_errors,
                "upstream": {
                    "url": first.url if first else settings.GPUSCHED_UPSTREAMS[0].url,
                    "reachable": first.reachable if first and first.checked_at else None,
                    "resident_model": first.resident_model or None if first else None,
                    "checked_at": first.checked_at.isoformat()
                    if first and first.checked_at
                    else None,
                    "error": first.error or None if first else None,
                },
                "gpus": [
                    rendering.gpu_entry(
                        gpu, running=running.get(gpu.pk, []), parallel=parallel, staff=False
                    )
                    for gpu in gpus
                ],
                "queue": {"queued": queue[JobStatus.QUEUED], "running": queue[JobStatus.RUNNING]},
            }
        )


def _gpu_problem(gpu: Gpu) -> str:
    if gpu_health(gpu) == GpuHealth.NO_DISPATCHER:
        return f"GPU {gpu.name}: no dispatcher (nothing claims jobs for it)"
    return f"GPU {gpu.name}: {gpu.error or 'llama-swap did not answer'}"
