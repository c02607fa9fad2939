"""The notices of the jobs table's trigger (queueapp/sql/job_notify.sql), read
in one place.

Why a trigger rather than calls in the services: every path that changes a
job's status (the services, the claim, recovery, the admin, raw SQL) is
covered, and no writer can forget it. NOTIFY is delivered at commit, never
for a rolled-back change.

The trigger speaks on two channels:
- `gpusched_work`, for the dispatchers (queueapp/dispatch/wakeup.py): what
  happened to the queue and on which GPU, a `WorkNotice`;
- `gpusched_gateway_<number>`, for the web process whose caller waits for a
  front-door job (queueapp/frontdoor/gateway.py): what became of that job, a
  `GatewayNotice`.

Both are JSON objects with every key always present and JSON null for a
fact that does not apply, so a new fact is a new key rather than a shifted
position, and a renamed key is an error here rather than a silent null.
tests/test_job_notices.py makes real changes and parses every notice the
trigger sends: the SQL and this parser cannot drift apart unnoticed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar

from queueapp.models import Job, JobStatus

WORK_CHANNEL = "gpusched_work"


def gateway_channel(number: int) -> str:
    """The channel on which gateway `number` hears about its callers' jobs."""
    return f"gpusched_gateway_{number}"


class WorkChange(StrEnum):
    QUEUED = "queued"  # a job to run: every idle dispatcher may take it
    FREED = "freed"  # a job left the running state on `gpu`
    GRANTED = "granted"  # a job started on `gpu`
    # Something else a dispatcher should look at again: a policy change, a
    # cancel that uncovers a new line head, a GPU's models or health.
    OTHER = "other"


@dataclass(frozen=True)
class WorkNotice:
    """A notice on the work channel."""

    change: WorkChange
    gpu: int | None = None  # the GPU freed or granted; None for the others

    @classmethod
    def parse(cls, payload: str) -> WorkNotice:
        """Raises ValueError for a payload that is not a work notice."""
        fields = _object(payload)
        try:
            change = WorkChange(_field(fields, "change", payload))
        except ValueError:
            raise ValueError(f"a work notice without a known change: {payload!r}") from None
        return cls(change=change, gpu=_integer(fields, "gpu", payload))

    def payload(self) -> str:
        """The notice as the trigger sends it, for a change it does not see."""
        return json.dumps({"change": self.change.value, "gpu": self.gpu})


@dataclass(frozen=True)
class GatewayNotice:
    """A notice on a gateway's channel: one of its jobs left `queued`. The
    claim's facts (token, lease) are None unless the job was granted."""

    job: int
    status: JobStatus
    claim_token: str | None
    lease_seconds: float | None
    lease_expires_at: float | None  # epoch seconds, by the database's clock
    effective_score: float | None  # as ranked at the claim
    gpu: int | None

    # The columns `of_job` reads: a job's body and result can be large.
    JOB_FIELDS: ClassVar[tuple[str, ...]] = (
        "status",
        "lease_owner",
        "lease_expires_at",
        "started_at",
        "score_at_dispatch",
        "gpu",
    )

    @classmethod
    def parse(cls, payload: str) -> GatewayNotice:
        """Raises ValueError for a payload that is not a gateway notice."""
        fields = _object(payload)
        job = _integer(fields, "job", payload)
        try:
            status = JobStatus(_field(fields, "status", payload))
        except ValueError:
            raise ValueError(f"a gateway notice without a known status: {payload!r}") from None
        token = _field(fields, "claim_token", payload)
        if job is None or not (token is None or isinstance(token, str)):
            raise ValueError(f"a gateway notice without a job, or a bad token: {payload!r}")
        return cls(
            job=job,
            status=status,
            claim_token=token,
            lease_seconds=_number(fields, "lease_seconds", payload),
            lease_expires_at=_number(fields, "lease_expires_at", payload),
            effective_score=_number(fields, "effective_score", payload),
            gpu=_integer(fields, "gpu", payload),
        )

    @classmethod
    def of_job(cls, job: Job) -> GatewayNotice:
        """The notice the trigger sent, or would have sent, as `job` left
        `queued`, read from its row (a notice lost while a listener
        reconnected)."""
        lease_seconds = None
        if job.lease_expires_at is not None and job.started_at is not None:
            lease_seconds = (job.lease_expires_at - job.started_at).total_seconds()
        score = (job.score_at_dispatch or {}).get("effective")
        return cls(
            job=job.pk,
            status=JobStatus(job.status),
            claim_token=job.lease_owner or None,
            lease_seconds=lease_seconds,
            lease_expires_at=(
                job.lease_expires_at.timestamp() if job.lease_expires_at is not None else None
            ),
            effective_score=None if score is None else float(score),
            gpu=job.gpu_id,
        )


def _object(payload: str) -> dict[str, Any]:
    try:
        fields = json.loads(payload)
    except ValueError:
        raise ValueError(f"a notice that is not JSON: {payload!r}") from None
    if not isinstance(fields, dict):
        raise ValueError(f"a notice that is not a JSON object: {payload!r}")
    return fields


def _field(fields: dict[str, Any], key: str, payload: str) -> Any:
    try:
        return fields[key]
    except KeyError:
        raise ValueError(f"no {key!r} in the notice {payload!r}") from None


def _integer(fields: dict[str, Any], key: str, payload: str) -> int | None:
    value = _field(fields, key, payload)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise ValueError(f"{key} is not an integer in the notice {payload!r}")
    return value


def _number(fields: dict[str, Any], key: str, payload: str) -> float | None:
    value = _field(fields, key, payload)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{key} is not a number in the notice {payload!r}")
    return float(value)
