"""Wait bounds: how long a caller is willing to wait for its job to start.

A bound comes from the `X-Gpusched-Max-Wait` header or, without one, from
the policy's default for the job's band (`max_wait_by_band`). A job whose
forecast start lies past its bound is refused at admission; a queued job
whose bound passes ends `expired`. Either way the caller is told what holds
each GPU it could use and how many jobs wait ahead: the words come from
here, the facts from the forecast (queueapp/eta.py).

Why the admission check runs after the job's INSERT, inside the
submission's transaction (services/jobs.py `_check_wait_bound`): the
forecast then plays the real row in its real place (its line, its lane
clock, the tier it was clamped by) with no pretend job, and a refusal is
an exception that rolls the row, its event and its notice back, so no job
ever existed. It costs one forecast, which every 201 already pays.

Why the expiry is a transition swept from several places rather than a
timer per job: a bound passes while the GPU is busy, when the dispatcher
itself waits on a long job, so the sweep (services.jobs_expire_overdue,
one index scan of `job_queued_wait_deadline`) runs on the dispatcher's
heartbeat thread and its idle loop, in every web process with callers
waiting, and on a minute schedule; whichever finds an overdue job first
expires it under the member's lines lock. `decide` keeps an overdue head
off every GPU (`Skip.OVERDUE`) and `transitions.start` refuses it, so an
overdue job never reaches llama-swap even before a sweep has seen it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from queueapp.policy.priority import BAND_ALIASES
from queueapp.policy.size_fit import UNSIZED_SPREAD, Z90

MAX_WAIT_HEADER = "X-Gpusched-Max-Wait"
# A bound past a day is a mistake, not a bound: refused, with this named.
MAX_WAIT_LIMIT_SECONDS = 86_400.0
# Retry-After when the forecast knows nothing better; never less than this.
RETRY_AFTER_MIN_SECONDS = 1


class WaitBoundInvalid(ValueError):
    """A bound that is not a positive number of seconds (at most a day)."""


def seconds_bound(value: Any) -> float:
    """A bound as seconds, from a header's text or a JSON number."""
    if isinstance(value, bool):
        raise WaitBoundInvalid(f"{value!r} is not a number of seconds")
    try:
        seconds = float(value.strip() if isinstance(value, str) else value)
    except (TypeError, ValueError):
        raise WaitBoundInvalid(f"{str(value)[:40]!r} is not a number of seconds") from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise WaitBoundInvalid(f"{str(value)[:40]!r}: the bound must be a positive number")
    if seconds > MAX_WAIT_LIMIT_SECONDS:
        raise WaitBoundInvalid(f"{seconds:g} s: the bound is at most {MAX_WAIT_LIMIT_SECONDS:g} s")
    return seconds


def parse_max_wait_header(raw: str | None) -> float | None:
    """The header's bound in seconds; None when absent. Raises
    WaitBoundInvalid for anything but a positive number (`abc`, `-5`, `0`)."""
    if raw is None:
        return None
    return seconds_bound(raw)


def band_defaults(value: Any) -> dict[str, float]:
    """The policy's `max_wait_by_band`, validated: {band: seconds}, a band
    an integer or an alias (stored as its integer). Raises WaitBoundInvalid
    naming the entry at fault."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise WaitBoundInvalid('an object {band: seconds}, e.g. {"interactive": 30, "-100": 3600}')
    defaults: dict[str, float] = {}
    for key, seconds in value.items():
        band = _band_of(str(key))
        try:
            defaults[str(band)] = seconds_bound(seconds)
        except WaitBoundInvalid as exc:
            raise WaitBoundInvalid(f"band {key}: {exc}") from None
    return defaults


def _band_of(key: str) -> int:
    text = key.strip()
    if text.lower() in BAND_ALIASES:
        return BAND_ALIASES[text.lower()]
    try:
        return int(text)
    except ValueError:
        aliases = ", ".join(BAND_ALIASES)
        raise WaitBoundInvalid(
            f"{key[:40]!r} is not a band (an integer or one of {aliases})"
        ) from None


def bound_for(*, header: float | None, band: int, defaults: Mapping[str, float]) -> float | None:
    """The job's bound: the header's, else its band's default, else none."""
    if header is not None:
        return header
    default = defaults.get(str(band))
    return None if default is None else float(default)


def retry_after(seconds: float | None, *, fallback: int) -> int:
    """Whole seconds for a Retry-After header: the forecast's figure rounded
    up, `fallback` when it knows none, and never under a second."""
    if seconds is None or not math.isfinite(seconds):
        return max(RETRY_AFTER_MIN_SECONDS, fallback)
    return max(RETRY_AFTER_MIN_SECONDS, math.ceil(seconds))


@dataclass(frozen=True)
class Holder:
    """A job running on a GPU the waiting job could use."""

    job_id: int
    model: str
    band: int
    held_seconds: float


@dataclass(frozen=True)
class GpuHeld:
    """One GPU the waiting job could use: its name and what runs there."""

    name: str
    holders: tuple[Holder, ...]


def _held_text(gpu: GpuHeld) -> str:
    name = gpu.name or "the GPU"
    if not gpu.holders:
        return f"{name} idle"
    held = " and ".join(
        f"job {h.job_id} ({h.model}, band {h.band}) for {h.held_seconds:.1f} s" for h in gpu.holders
    )
    return f"{name} held by {held}"


def busy_message(*, gpus: Sequence[GpuHeld], ahead: int, tail: str) -> str:
    """ "gpu0 held by job 17 (image-xl, band 0) for 12.4 s; 19 jobs wait
    ahead; <tail>": what holds each GPU the job could use, how many jobs
    are expected to start before it, and `tail` (why that is a refusal)."""
    parts = [_held_text(gpu) for gpu in gpus] or ["no GPU can run it now"]
    parts.append(f"{ahead} job{'' if ahead == 1 else 's'} wait{'s' if ahead == 1 else ''} ahead")
    return "; ".join([*parts, tail])


def refusal_tail(*, start_in: float | None, bound: float, at_least: float | None = None) -> str:
    """Why a submission is refused: its estimated start is past its bound
    (`at_least`: not placed, but it cannot start before then)."""
    if start_in is not None:
        return f"estimated start in {start_in:.0f} s is past the {bound:g} s bound"
    if at_least is not None:
        return f"estimated start in more than {at_least:.0f} s is past the {bound:g} s bound"
    return f"no GPU is forecast to start it within the {bound:g} s bound"


def expiry_tail(*, bound: float) -> str:
    """Why a queued job expired: its bound passed before it started."""
    return f"it did not start within its {bound:g} s bound"


# -- refusing only what cannot start in time ---------------------------------------------


@dataclass(frozen=True)
class RunAhead:
    """A run the waiting job's start waits for on its GPU: the rest of a
    running job, or a queued job's run with its swap, as the median and the
    90th percentile of its estimate (queueapp/policy/expected.py)."""

    p50: float
    p90: float | None  # None: an estimate without a spread (UNSIZED_SPREAD is assumed)


def run_ahead(*, ends_in: float, p50: float | None, p90: float | None) -> RunAhead:
    """A run the waiting job's start waits for, ending `ends_in` seconds
    from now as the forecast plays it (a running job's rest, or a queued
    job's run with its load), with the spread of its estimate: its p90 lies
    as far past that end as the estimate's p90 past its p50 (a load has no
    spread). Without an estimate, None: UNSIZED_SPREAD is assumed."""
    ends_in = max(0.0, ends_in)
    if p50 is None or p90 is None:
        return RunAhead(ends_in, None)
    return RunAhead(ends_in, ends_in + max(0.0, p90 - p50))


def lucky_start_in(*, start_in: float, ahead: Sequence[RunAhead]) -> float:
    """How soon the job starts if the runs ahead of it go well: the
    forecast's start (every run ahead at its median) less Z90 standard
    deviations of their sum, each run's spread read from its p90 (a
    log-normal run of median m and p90 m·e^(Z90·σ) has a deviation of about
    m·σ), the runs independent. The job starts before this about one time
    in ten, as far as the run times decide it."""
    variance = 0.0
    for run in ahead:
        sigma = _sigma_of(run)
        variance += (max(0.0, run.p50) * sigma) ** 2
    return max(0.0, start_in - Z90 * math.sqrt(variance))


def refuses_for_bound(*, start_in: float | None, ahead: Sequence[RunAhead], bound: float) -> bool:
    """Whether admission refuses a job bounded to `bound` seconds whose
    forecast start (runs ahead at their medians) is `start_in` seconds away
    (None: the forecast does not place it, which refuses it as today).

    The p90 rule: refuse only when even the lucky start (`lucky_start_in`)
    is past the bound, so that a refusal is a promise kept nine times in
    ten: the job would not have started in time. A job whose likely start
    misses but whose lucky one makes it is admitted; if its luck fails it
    expires at its bound, as any admitted job whose forecast went wrong."""
    if start_in is None:
        return True
    return lucky_start_in(start_in=start_in, ahead=ahead) > bound


def _sigma_of(run: RunAhead) -> float:
    if run.p90 is None or run.p50 <= 0 or run.p90 <= run.p50:
        return UNSIZED_SPREAD if run.p90 is None else 0.0
    return math.log(run.p90 / run.p50) / Z90
