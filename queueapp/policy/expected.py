"""A job's expected run time, with what it rests on.

In order of trust:

- `size`: the job's size (queueapp/policy/request_size.py) on its model and
  path's learned line (queueapp/policy/size_fit.py);
- `model`: the model and path's learned mean, for a body without size or
  before the line has runs enough;
- `operator`: the model's `typical_seconds`, set in the admin, before any
  run of the model and path is learned;
- `unknown`: nothing yet; p50 and p90 are null, and an ETA resting on it is
  a guess, said so wherever it is shown.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from queueapp.policy.size_fit import FittedLine, unsized_p90

# The newest run's weight in a model's decayed mean: about the last 5 runs
# count (services/run_stats.py writes the same arithmetic in SQL).
NEWEST_RUN_WEIGHT = 0.3
# What a run is taken to last, for the forecast's play, before anything of
# any model is learned: a guess, and labelled so (eta.QueueForecast.is_guess).
DEFAULT_RUN_SECONDS = 60.0


def decayed_mean(previous: float | None, seconds: float) -> float:
    """A decayed mean with one more run of `seconds`."""
    if previous is None:
        return seconds
    return previous * (1 - NEWEST_RUN_WEIGHT) + seconds * NEWEST_RUN_WEIGHT


class Basis(StrEnum):
    SIZE = "size"
    MODEL = "model"
    OPERATOR = "operator"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Expected:
    """Run seconds, without the swap: the median and the 90th percentile."""

    p50: float | None
    p90: float | None
    basis: Basis
    size: float | None = None  # the number the line used; None when none was read
    size_text: str = ""  # the size as `why` names it ("362 frames, 30 steps")

    def as_json(self) -> dict[str, Any]:
        """`expected_seconds` of the job's API answer."""
        return {
            "p50": None if self.p50 is None else round(self.p50, 3),
            "p90": None if self.p90 is None else round(self.p90, 3),
            "size": self.size,
            "basis": self.basis.value,
        }


def expected_run(
    *,
    size: float | None,
    size_text: str = "",
    line: FittedLine | None,
    model_mean: float | None,
    typical_seconds: float | None,
) -> Expected:
    """The best estimate these facts allow, by the order above."""
    if size is not None and line is not None:
        return Expected(line.median(size), line.p90(size), Basis.SIZE, size, size_text)
    if model_mean is not None:
        return Expected(model_mean, unsized_p90(model_mean), Basis.MODEL, size, size_text)
    if typical_seconds is not None:
        return Expected(
            typical_seconds, unsized_p90(typical_seconds), Basis.OPERATOR, size, size_text
        )
    return Expected(None, None, Basis.UNKNOWN, size, size_text)
