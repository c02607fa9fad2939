"""How long a run of a given size takes, learned per model and path.

A run's seconds follow a power of its size (queueapp/policy/request_size.py):
seconds = e^a × size^b, a straight line in logarithms, y = a + b·x with
x = ln(size) and y = ln(seconds). The line is fitted by least squares over
the runs seen, the older ones weighing less (each new run multiplies the
weight of those before it by FIT_DECAY), so the fit follows a model whose
speed changes (a new quantisation, another GPU).

Why logarithms: run times of one model differ by factors (a 60-frame and a
360-frame shot), and their noise is a factor too (±20 %, not ±20 s); a
line in logarithms weighs a short and a long run alike and makes the
spread a factor, so that p90 = p50 × e^(1.2816 σ).

Why a prior on the slope: until runs of different sizes are seen, the data
cannot tell the slope. The fit then assumes run time proportional to size
(b = 1), the rule the common servers follow (frames, steps, pixels, tokens),
and the runs move it as their sizes spread: the slope is
(Cxy + λ) / (Cxx + λ), least squares with a penalty λ(b − 1)², where Cxx and
Cxy are the centred sums. The slope is bounded to [0, 2], and an estimate
never goes under MIN_RUN_SECONDS.

Only sufficient statistics are kept (`SizeFitSums`: six decayed sums), so a
run is folded in by one atomic UPDATE (services/run_stats.py writes the same
arithmetic in SQL; a test holds the two to each other).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

# The weight an older run keeps at each newer one: about the last 10 runs count.
FIT_DECAY = 0.9
# The penalty on a slope away from 1 (proportional to size), in the units of
# Cxx (squared log sizes times weight): ten runs of sizes spread by a factor
# of 6 give Cxx ≈ 3, which it pulls by about 15 %, enough to steady a slope
# from noisy runs (tests/policy/test_size_fit.py) without hiding a real one.
SLOPE_PRIOR = 0.5
SLOPE_RANGE = (0.0, 2.0)
# The runs (by weight) below which the fit is not used: the model's mean is.
MIN_FIT_WEIGHT = 1.5
# The spread assumed of a fit with few runs, as one pseudo-run's residual
# (in logarithms: 0.25 is about ±28 %), so that two runs that happened to
# agree do not make a p90 equal to the p50.
PRIOR_SPREAD = 0.25
# The spread assumed of an estimate that knows no size (the model's mean,
# the operator's typical_seconds): 0.5 in logarithms, a p90 of 1.9 × p50.
UNSIZED_SPREAD = 0.5
MIN_RUN_SECONDS = 0.05
# The 90th percentile of a standard normal.
Z90 = 1.2816


@dataclass(frozen=True)
class SizeFitSums:
    """The decayed sums of a model and path's sized runs: weight, x, y, x², xy, y²."""

    weight: float = 0.0
    x: float = 0.0
    y: float = 0.0
    xx: float = 0.0
    xy: float = 0.0
    yy: float = 0.0

    def with_run(self, size: float, seconds: float) -> SizeFitSums:
        """These sums with one more run of `size` that took `seconds`."""
        x, y = math.log(size), math.log(max(seconds, MIN_RUN_SECONDS))
        d = FIT_DECAY
        return SizeFitSums(
            weight=self.weight * d + 1,
            x=self.x * d + x,
            y=self.y * d + y,
            xx=self.xx * d + x * x,
            xy=self.xy * d + x * y,
            yy=self.yy * d + y * y,
        )

    def line(self) -> FittedLine | None:
        """The fitted line; None until MIN_FIT_WEIGHT of runs are folded in."""
        w = self.weight
        if w < MIN_FIT_WEIGHT:
            return None
        mean_x, mean_y = self.x / w, self.y / w
        cxx = max(0.0, self.xx - self.x * mean_x)
        cxy = self.xy - self.x * mean_y
        slope = (cxy + SLOPE_PRIOR) / (cxx + SLOPE_PRIOR)
        slope = min(max(slope, SLOPE_RANGE[0]), SLOPE_RANGE[1])
        intercept = mean_y - slope * mean_x
        # Σw(y − a − bx)², from the sums: the centred y² less what the line explains.
        cyy = max(0.0, self.yy - self.y * mean_y)
        residual = max(0.0, cyy - 2 * slope * cxy + slope * slope * cxx)
        spread = math.sqrt((residual + PRIOR_SPREAD**2) / (w + 1))
        return FittedLine(intercept=intercept, slope=slope, spread=spread, runs=w)


@dataclass(frozen=True)
class FittedLine:
    """ln(seconds) = intercept + slope · ln(size), with the residuals' spread."""

    intercept: float
    slope: float
    spread: float
    runs: float  # the decayed count of runs behind it

    def median(self, size: float) -> float:
        return max(MIN_RUN_SECONDS, math.exp(self.intercept + self.slope * math.log(size)))

    def p90(self, size: float) -> float:
        return self.median(size) * math.exp(Z90 * self.spread)


def unsized_p90(p50: float) -> float:
    """The p90 of an estimate that knows no size: a mean or the operator's figure."""
    return p50 * math.exp(Z90 * UNSIZED_SPREAD)


def spread_of(p50: float | None, p90: float | None) -> float:
    """The spread (σ of ln seconds) an estimate's p90 says; without one, UNSIZED_SPREAD."""
    if p50 is None or p90 is None or p50 <= 0 or p90 < p50:
        return UNSIZED_SPREAD
    return math.log(p90 / p50) / Z90


def run_so_far_median(*, median: float, spread: float, elapsed: float) -> float:
    """The median of a run that has already lasted `elapsed` seconds: its
    run time is log-normal (median `median`, σ `spread`) and longer than
    `elapsed`, so half the runs that lasted so long end before this.

    A run not yet at its median is expected near it; one past it is not
    expected to end now, which the plain median would say (every job that
    outlasted its estimate then looked about to end, and each ETA behind it
    came early), but later the longer it has run. Why the median: it is
    the figure with the least absolute error, which is how an ETA is judged."""
    if median <= 0:
        return max(0.0, elapsed)
    ratio = elapsed / median
    if ratio <= 0 or spread <= 0:  # not started, or a ratio too small for a float
        return max(median, elapsed)
    normal = NormalDist()
    survived = normal.cdf(max(-40.0, min(40.0, math.log(ratio) / spread)))
    halfway = min(1.0 - 1e-12, (1.0 + survived) / 2.0)
    return max(elapsed, median * math.exp(spread * normal.inv_cdf(halfway)))
