"""Callers who bound their wait or leave mid-run, in the replay on several GPUs.

Live, a caller may bound its wait (`X-Gpusched-Max-Wait`, or the policy's
default for its band): a job still queued when the bound passes ends
`expired` and never reaches llama-swap. A front-door caller may also hang
up while its job runs; the model's `on_caller_gone` then either closes the
upstream request (`close`: llama-server stops the generation and the GPU
frees at once) or reads the answer to its end and discards it (`drain`:
image and video servers finish the render, and the GPU stays held until
then, so no second request overlaps it). The replay models both:

- a share of the jobs carries `max_wait`; one still queued when it passes
  expires (counted; the live admission would refuse at once a job the
  forecast says cannot start in time, which the replay counts the same way,
  at its deadline);
- a share of the top band's jobs (the front door's interactive callers)
  has its caller leave `leave_at` of the way through its run: a chat (or a
  tool call) is closed, and its GPU frees then; any other model is drained,
  and its GPU is held to the end, the rest of the run counted as drained.

Which jobs do either is drawn from the job's id (a hash), so a run is
repeatable and every policy sees the same callers.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from queueapp.simulation.traces import TraceJob

# Models whose servers stop a generation when the connection closes
# (llama-server); every other kind renders to its end. The live default
# follows the path the same way (chat, completions, embeddings: close).
CLOSED_KINDS = frozenset({"chat", "tool"})


def on_caller_gone(job: TraceJob) -> str:
    """`close` or `drain`, as the live default for the job's kind of call."""
    return "close" if job.kind in CLOSED_KINDS or job.model.startswith("chat") else "drain"


def _drawn(job: TraceJob, salt: str, share: float) -> bool:
    """Whether `job` is among `share` of the jobs, drawn from its id."""
    return zlib.crc32(f"{salt}:{job.id}".encode()) / 2**32 < share


@dataclass(frozen=True)
class Callers:
    max_wait: float | None = None  # seconds a bounded job may wait in the queue
    bounded_share: float = 1.0  # of every job
    leave_share: float = 0.0  # of the top band's jobs
    leave_at: float = 0.5  # of its run, when a leaving caller goes

    def __post_init__(self) -> None:
        for name in ("bounded_share", "leave_share", "leave_at"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be between 0 and 1, got {value}")
        if self.max_wait is not None and self.max_wait < 0:
            raise ValueError(f"max_wait must be at least 0, got {self.max_wait}")

    @property
    def active(self) -> bool:
        return self.max_wait is not None or self.leave_share > 0

    def bound_of(self, job: TraceJob) -> float | None:
        if self.max_wait is None or not _drawn(job, "bound", self.bounded_share):
            return None
        return self.max_wait

    def leaves(self, job: TraceJob, *, top_band: bool) -> bool:
        return top_band and self.leave_share > 0 and _drawn(job, "leave", self.leave_share)

    def describe(self) -> str:
        parts = []
        if self.max_wait is not None:
            parts.append(
                f"{self.bounded_share:.0%} of jobs bound their wait to {self.max_wait:g} s"
            )
        if self.leave_share > 0:
            parts.append(
                f"{self.leave_share:.0%} of the top band's callers leave {self.leave_at:.0%} "
                "into their run (chats closed, other models drained)"
            )
        return "; ".join(parts)
