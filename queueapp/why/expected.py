"""What the job was expected to run, and on what that rests: the figures set
at its submission (queueapp/policy/expected.py), told as `why` tells them
("expected 9 min 40 s, p90 12 min (362 frames, 30 steps, 832×480; learned
by size from 37 runs of wan-video)")."""

from __future__ import annotations

from typing import Any

from queueapp.durations import Durations
from queueapp.models import Job
from queueapp.policy.expected import Basis
from queueapp.rendering import job_expected
from queueapp.why.summary import duration_words


def expected_entry(job: Job, durations: Durations) -> dict[str, Any]:
    """`why`'s `expected`: the job's `expected_seconds` and its sentence."""
    expected = job_expected(job)
    return {
        **expected.as_json(),
        "size_text": expected.size_text or None,
        "text": _sentence(job, expected.basis, durations),
    }


def _sentence(job: Job, basis: Basis, durations: Durations) -> str:
    if basis is Basis.UNKNOWN or job.expected_p50 is None:
        return (
            f"Its run had no estimate: no run of {job.model} on {job.path} was learned yet "
            "and no typical run is set for it, so any time given for it was a guess."
        )
    figures = f"Its run was expected to take {duration_words(job.expected_p50)}" + (
        f" (p90 {duration_words(job.expected_p90)})" if job.expected_p90 is not None else ""
    )
    runs = round(durations.learned_runs(job.model, job.path))
    learned = f"{runs} run{'' if runs == 1 else 's'} of {job.model}"
    if basis is Basis.SIZE:
        return f"{figures}: {job.size_text}, learned by size from {learned}."
    if basis is Basis.MODEL:
        why_not_size = (
            "its body gave no size"
            if job.size is None
            else f"too few runs by size yet for {job.size_text}"
        )
        return f"{figures}: the mean of {learned} ({why_not_size})."
    return f"{figures}: the typical run the operator set for {job.model}, none learned yet."
