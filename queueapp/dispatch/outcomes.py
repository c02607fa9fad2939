"""What a claim answers: a job claimed, or why none was.

A claim never answers a bare None (Kueue's "every skipped entry carries a
status"): `ClaimedJob` when a job was marked running, `GpuBusy` while the
GPU's slots are taken or it drains, `CallersGone` when the only heads are
front-door jobs whose web process died, `HeadsOverdue` when the only heads
are past their wait bound, and `NoClaim` with a kind and a reason
otherwise (nothing written).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from queueapp.models import Job


@dataclass(frozen=True)
class ClaimedJob:
    """A job the claim marked running, with what its claimer needs to run
    it: built whole by the claim (claim.py `_start`), or by a front-door
    caller from the record its grant's notice carries (`ClaimRecord.to_caller`)."""

    job_id: int
    path: str
    body: Any
    model: str
    claim_token: str  # fences a late finish after the lease was lost
    lease_seconds: float
    swap_needed: bool | None  # None: not known here, read from the decision at finish
    # The caller's connection makes the call (OpenAI front door); the
    # dispatcher only holds the GPU for it until the job ends.
    granted: bool = False
    effective_score: float | None = None  # as ranked at the claim
    gpu_id: int | None = None  # the GPU it was claimed for
    upstream_url: str = ""  # that GPU's llama-swap (its row's URL at the claim)
    gpu_slot: int = 0
    in_flight: int = 1  # jobs running on the GPU with it, itself included
    # Its model's jobs may share the GPU (parallel > 1): the dispatcher runs
    # it alongside others rather than waiting for its end.
    shared: bool = False

    @property
    def record(self) -> ClaimRecord:
        return ClaimRecord(
            job_id=self.job_id,
            claim_token=self.claim_token,
            lease_seconds=self.lease_seconds,
            gpu_id=self.gpu_id,
            granted=self.granted,
            effective_score=self.effective_score,
            swap_needed=self.swap_needed,
        )


@dataclass(frozen=True)
class ClaimRecord:
    """A running job's claim as its row or its grant's notice records it:
    what renewing the lease and ending the job need, and nothing to run it
    with. The token fences an end after the lease was lost."""

    job_id: int
    claim_token: str
    lease_seconds: float
    gpu_id: int | None
    granted: bool = False
    effective_score: float | None = None
    swap_needed: bool | None = None  # None: the end reads it from the decision

    @classmethod
    def of_row(cls, job: Job, *, lease_seconds: float = 0.0) -> ClaimRecord:
        """The claim a running job's row records, to end the job as its holder would."""
        return cls(
            job_id=job.pk,
            claim_token=job.lease_owner,
            lease_seconds=lease_seconds,
            gpu_id=job.gpu_id,
            granted=job.front_door,
        )

    def to_caller(self, *, path: str, body: Any, model: str, upstream_url: str) -> ClaimedJob:
        """The grant a front-door caller runs: this record with its own call."""
        return ClaimedJob(
            job_id=self.job_id,
            path=path,
            body=body,
            model=model,
            claim_token=self.claim_token,
            lease_seconds=self.lease_seconds,
            swap_needed=self.swap_needed,
            granted=True,
            effective_score=self.effective_score,
            gpu_id=self.gpu_id,
            upstream_url=upstream_url,
        )


# Either holds a running job: the lease's renewal and the job's end take both.
HeldClaim = ClaimedJob | ClaimRecord


@dataclass(frozen=True)
class GpuBusy:
    """Another dispatcher's job holds the GPU until its lease expires."""

    job_id: int
    seconds_left: float  # until its lease expires, bounded to a short re-check
    # A front-door job whose caller's web process died: nobody will use or
    # end it, so it is failed now rather than at lease expiry.
    caller_gone: bool = False
    # Slots are free, but a better job of another model waits for the jobs
    # in flight to end (a swap is exclusive): none is given meanwhile.
    draining: bool = False
    # With resident sets, a job that arrives during a drain may still
    # start beside (decide._beside_in_flight): any notice is worth a claim.
    wake_on_work: bool = False


@dataclass(frozen=True)
class CallersGone:
    """The only queued heads are front-door jobs whose web process died: cancel
    them (services.front_door_orphans_cancel) and claim again."""

    job_ids: list[int]


@dataclass(frozen=True)
class HeadsOverdue:
    """The only heads the GPU may take are past their wait bound: expire
    them (services.jobs_expire_overdue) and claim again."""

    job_ids: list[int]


class Unclaimed(StrEnum):
    CLAIMING = "claiming"  # another claim of the GPU holds its lock: it grants the best job
    STOPPED = "stopped"  # dispatch is paused, or the GPU is disabled
    NOTHING = "nothing"  # nothing queued that the GPU may take
    ANOTHER_JOB = "another_job"  # a front-door claim: the winner is not one of its callers
    HELD = "held"  # the winner's row or its member's lines are held by another transaction


@dataclass(frozen=True)
class NoClaim:
    """Nothing was claimed, and nothing written: `kind` says why, `reason` in words."""

    kind: Unclaimed
    reason: str


ClaimOutcome = ClaimedJob | GpuBusy | CallersGone | HeadsOverdue | NoClaim


def claimed(outcome: ClaimOutcome) -> ClaimedJob | None:
    """The job claimed, for a caller that acts only on a claim (a job's end
    that claims the next in its commit, an admission)."""
    return outcome if isinstance(outcome, ClaimedJob) else None
