"""The holder watchdog's rule: when a running job has held its GPU too long.

A job runs long once it has held its GPU for `RUNNING_LONG_FACTOR` times
its estimate (what a run of its size takes on its model and path,
queueapp/durations.py `Durations.job_run_seconds`), and never before the policy's minimum
(`running_long_min_seconds`, 10 min by default): a chat answer estimated
at 2 s that takes 7 s is not worth a line in anyone's log, a render
estimated at 8 min that is still running after 24 min is. The rule only
reports; a started job is never interrupted (DESIGN.md).

The words of the warning are here too, so the log line, the event's
detail and the tests agree on them.
"""

from __future__ import annotations

from dataclasses import dataclass

# A job is reported once it has run this many times its estimate ...
RUNNING_LONG_FACTOR = 3.0
# ... and at least this long (the policy's default for `running_long_min_seconds`).
RUNNING_LONG_MIN_SECONDS = 600.0


def running_long_after(*, estimate_seconds: float, min_seconds: float) -> float:
    """Seconds of holding its GPU after which a job runs long."""
    return max(RUNNING_LONG_FACTOR * max(0.0, estimate_seconds), max(0.0, min_seconds))


@dataclass(frozen=True)
class RunningLong:
    """A running job the watchdog reports, as its warning names it."""

    job_id: int
    gpu: str  # "" when the job has no GPU (a single unregistered llama-swap)
    member: str
    model: str
    held_seconds: float
    limit_seconds: float  # `running_long_after` for this job
    estimate_seconds: float

    def message(self) -> str:
        """The one WARNING line: GPU, job, member, model and minutes held."""
        return (
            f"running long: {self.gpu or 'the GPU'} held by job {self.job_id} "
            f"(member {self.member}, model {self.model}) for {_minutes(self.held_seconds)}, "
            f"past its limit of {_minutes(self.limit_seconds)} "
            f"({RUNNING_LONG_FACTOR:g} x its estimate of {_minutes(self.estimate_seconds)}, "
            "or the policy's minimum)"
        )

    def detail(self) -> dict[str, float | str]:
        """The `running_long` event's detail."""
        return {
            "gpu": self.gpu,
            "held_seconds": round(self.held_seconds, 3),
            "limit_seconds": round(self.limit_seconds, 3),
            "estimate_seconds": round(self.estimate_seconds, 3),
        }


def _minutes(seconds: float) -> str:
    """Minutes with one decimal; seconds under a minute (a limit set low still reads)."""
    return f"{seconds:.1f} s" if seconds < 60 else f"{seconds / 60:.1f} min"
