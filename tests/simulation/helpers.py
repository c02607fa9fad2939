"""Tiny hand-made traces for the simulator's tests."""

from __future__ import annotations

from queueapp.simulation.traces import Trace, TraceJob

MEMBERS = {"ann": "free", "bo": "pro", "cy": "max"}


def job(name: str, *, at: float = 0.0, member: str = "ann", priority: str | None = None,
        model: str = "a", seconds: float = 10.0, **extra) -> TraceJob:  # fmt: skip
    return TraceJob(
        id=name, member=member, priority=priority, model=model, seconds=seconds, at=at, **extra
    )


def trace(*jobs: TraceJob, **options) -> Trace:
    options.setdefault("swap_seconds", 5.0)
    options.setdefault("duration_seconds", 100.0)
    return Trace(name="tiny", jobs=tuple(jobs), members=dict(MEMBERS), **options)
