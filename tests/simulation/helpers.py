"""Tiny hand-made traces for the simulator's tests."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hypothesis import strategies as st

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


PRIORITIES = ["interactive", "normal", "batch", None]


def drawn_jobs(
    draw: st.DrawFn,
    *,
    count: int,
    within: int,
    members: Sequence[str],
    models: Mapping[str, tuple[float, float]],
) -> list[TraceJob]:
    """`count` jobs drawn by hypothesis: arriving within `within` seconds,
    of the members and bands given, each model's run time in its range."""
    jobs = []
    for n in range(count):
        model = draw(st.sampled_from(sorted(models)))
        low, high = models[model]
        jobs.append(
            job(
                f"j{n:02d}",
                at=draw(st.integers(0, within)),
                member=draw(st.sampled_from(sorted(members))),
                priority=draw(st.sampled_from(PRIORITIES)),
                model=model,
                seconds=float(draw(st.integers(int(low), int(high)))),
            )
        )
    return jobs
