"""What every operation of the API documents beyond its body: the request
headers it reads, the headers of its answers, and its error answers, for
the OpenAPI schema (the shapes are in queueapp/api/schema.py)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse

from queueapp.api.schema import ErrorOutput
from queueapp.policy.wait_bound import MAX_WAIT_HEADER, MAX_WAIT_LIMIT_SECONDS

PRIORITY_HEADER = "X-LlamaSwap-Priority"

priority_parameter = OpenApiParameter(
    PRIORITY_HEADER,
    OpenApiTypes.STR,
    OpenApiParameter.HEADER,
    description="Signed integer or interactive / normal / batch / background; clamped to the "
    "tier's floor and cap; unparseable means 0. Wins over a `priority` in the JSON body; "
    "without either, the policy's band for the path (priority_by_path).",
)

max_wait_parameter = OpenApiParameter(
    MAX_WAIT_HEADER,
    # OpenAPI 3.0's form: a number above 0, at most a day.
    {
        "type": "number",
        "minimum": 0,
        "exclusiveMinimum": True,
        "maximum": MAX_WAIT_LIMIT_SECONDS,
    },
    OpenApiParameter.HEADER,
    description="Seconds the caller will wait for the job to start (a positive number). A job "
    "the forecast cannot start within it is refused: 503, code gpu_busy, Retry-After; a "
    "queued job whose bound passes ends `expired`. Absent: the policy's default for the band.",
)


ERROR_ANSWERS = {
    400: "Invalid input or an unknown query parameter; `detail` names the field.",
    401: "No token, or a token that matches no member.",
    403: "Staff only.",
    404: "No such job or chain for this member (another member's is 404 too).",
    409: "The job already started (jobs are never interrupted).",
    413: "The body is over GPUSCHED_MAX_BODY_BYTES (1 MiB by default); `detail` says by how much.",
    415: "The body is not JSON (Content-Type application/json).",
    429: "Too many failed logins from this address, or (submissions) the tier's "
    "queued-jobs limit; see Retry-After.",
    503: "The database is unavailable (restarting), or (submissions) the queue is closed "
    "for maintenance, or (code gpu_busy) the job cannot start within its wait bound; "
    "see Retry-After.",
}


# Every 429 and 503 of a call with a token says when to try again: the
# exception handler (queueapp/api/errors.py), DRF's Throttled for failed
# logins, and the database-outage answer (queueapp/error_pages.py) set it.
retry_after_header = OpenApiParameter(
    "Retry-After",
    OpenApiTypes.INT,
    OpenApiParameter.HEADER,
    required=True,
    response=[429, 503],
    description="Seconds to wait before trying again.",
)

submitted_headers = [
    OpenApiParameter(
        "X-Gpusched-Priority-Requested",
        OpenApiTypes.INT,
        OpenApiParameter.HEADER,
        required=True,
        response=[201],
        description=f"The priority the {PRIORITY_HEADER} header asked for (0 without one).",
    ),
    OpenApiParameter(
        "X-Gpusched-Priority-Applied",
        OpenApiTypes.INT,
        OpenApiParameter.HEADER,
        required=True,
        response=[201],
        description="The priority the job got: the requested one clamped to the tier's "
        "floor and cap.",
    ),
    OpenApiParameter(
        "Location",
        OpenApiTypes.STR,
        OpenApiParameter.HEADER,
        required=True,
        response=[201],
        description="The new job's path, /api/jobs/{id}/.",
    ),
]


def answers(ok: dict[Any, Any], *errors: int) -> dict[Any, Any]:
    """The documented answers of an operation that needs a token: `ok`, the
    errors named, and those any such call can get (400 for an unknown query
    parameter, 401, 429, 503)."""
    documented = dict(ok)
    for code in sorted({*errors, 400, 401, 429, 503}):
        documented[code] = OpenApiResponse(ErrorOutput, description=ERROR_ANSWERS[code])
    return documented
