"""The one score: effective = band + tier_bonus + swap_affinity + aging
(+ shortness, when the policy's shortest_first_weight is above 0).

Shortness is W / (1 + expected / scale): W for a job expected to take no
time, W/2 for one expected to take `scale` seconds, towards 0 for a long
one, and 0 for a job whose run has no estimate (it does not jump ahead on
a guess). It is bounded by W, so it orders jobs inside a band: W plus the
largest tier and affinity bonuses must stay under the band spacing
(`check_invariant`), and aging, unbounded, still carries any job past a
band in the time docs/policy.md states, so nothing starves. A job's
expectation is fixed at its submission, so its shortness is too: it is
part of its stored `rank_key`.

`rank_key` is the part of the score that does not depend on the clock or on
the resident model. With one aging divisor for every job,

    effective = rank_key + swap_affinity + (now - AGING_EPOCH_SECONDS) / divisor

and the last term is the same for every job at a given instant, so ordering
by `rank_key` (plus the affinity bonus for the resident models' jobs) is
ordering by `effective`. The database stores `rank_key` in an index, which
turns "best job" into an index scan instead of a sort of the queue (ordering
by `now() - submitted_at` could use no index).

The stored key only fetches candidates; `rank` decides, recomputed from the
inputs, so the claim, the queue view and the simulator run one function. The
best job is either the best by key or the best of a resident model by key
plus the affinity bonus, so the top few of the indexes always hold it.
A key goes stale when its inputs change (a tier's bonus, a member's tier,
the aging divisor): the change re-keys the queued heads in its own
transaction (queueapp/services/policy.py).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from queueapp.policy.priority import BAND_ALIASES

# Ages are measured from this instant (2025-01-01T00:00:00Z) so that rank
# keys stay small numbers with plenty of float precision.
AGING_EPOCH_SECONDS = 1735689600.0


# One name per band, the first listed: batch and background share -100.
_BAND_NAMES: dict[int, str] = {}
for _name, _band in BAND_ALIASES.items():
    _BAND_NAMES.setdefault(_band, _name)
_ALIASES_LOW_TO_HIGH = [(_BAND_NAMES[band], band) for band in sorted(_BAND_NAMES)]
_ALIAS_BANDS = sorted(_BAND_NAMES)
# The smallest gap between neighbouring alias bands (interactive, normal,
# batch): the band spacing the invariant may assume at most.
ALIAS_SPACING = min(high - low for low, high in zip(_ALIAS_BANDS, _ALIAS_BANDS[1:], strict=False))


class PolicyInvariantError(ValueError):
    """Settings that would let bounded terms cross a band."""


@dataclass(frozen=True)
class PolicySettings:
    aging_divisor: float = 60.0  # seconds of waiting per point
    swap_affinity_bonus: float = 10.0
    band_spacing: int = 100
    # Shorter first inside a band: the most points a short job gets (0: off),
    # and the expected seconds at which it gets half of them.
    shortest_first_weight: float = 0.0
    shortest_first_scale: float = 60.0


@dataclass(frozen=True)
class Candidate:
    """A queued job as the policy sees it; times are unix seconds."""

    job_id: int
    band: int
    tier_bonus: float
    model: str
    submitted_at: float
    # When this job started to age: its submission, or the last time a job of
    # the same member in the same band was dispatched, whichever is later
    # (the lane clock; see docs/policy.md).
    eligible_at: float
    member_id: int = 0
    # The one GPU (by name) that may run it; None: any (decide's Skip.PINNED).
    pinned_gpu: str | None = None
    # When its wait bound passes (unix seconds); None: no bound (decide's
    # Skip.OVERDUE). The forecast plays without it, as if no bound passed.
    wait_deadline: float | None = None
    # Its shortness term (`shortness`), fixed at its submission.
    shortness: float = 0.0
    # Its expected run (p50 seconds, set at its submission from its size);
    # None: no estimate. What "this job is short" reads (`runs_short`).
    expected_seconds: float | None = None

    @property
    def lane(self) -> tuple[int, int]:
        """Jobs whose aging restarts together (the lane clock)."""
        return (self.member_id, self.band)

    @property
    def line(self) -> tuple[int, int, str]:
        """Jobs that differ only in age, so go in submission order."""
        return (self.member_id, self.band, self.model)


@dataclass(frozen=True)
class ScoreTerms:
    band: int
    tier_bonus: float
    swap_affinity: float
    aging: float
    effective: float
    waited_seconds: float  # since submission
    aged_seconds: float  # since the lane clock: what aging counts
    shortness: float = 0.0

    def as_dict(self) -> dict[str, float]:
        terms = {
            "band": self.band,
            "tier_bonus": self.tier_bonus,
            "swap_affinity": self.swap_affinity,
            "aging": round(self.aging, 6),
            "effective": round(self.effective, 6),
            "waited_seconds": round(self.waited_seconds, 3),
            "aged_seconds": round(self.aged_seconds, 3),
        }
        if self.shortness:  # a term of its own only where shorter-first is on
            terms["shortness"] = round(self.shortness, 6)
        return terms


@dataclass(frozen=True)
class RankedCandidate:
    candidate: Candidate
    terms: ScoreTerms
    sort_key: float  # rank_key + swap_affinity: orders exactly like `effective`


def rank_key(
    *,
    band: int,
    tier_bonus: float,
    eligible_at: float,
    aging_divisor: float,
    shortness: float = 0.0,
) -> float:
    return band + tier_bonus + shortness - (eligible_at - AGING_EPOCH_SECONDS) / aging_divisor


def runs_short(candidate: Candidate, bound: float | None, short_models: frozenset[str]) -> bool:
    """Whether `candidate` is expected to run under `bound` seconds (a
    reservation's, the borrowing guard's): by its own estimate when it has
    one, else by its model's (`short_models`: those known to run under it;
    a model not learned yet is not)."""
    if candidate.expected_seconds is not None and bound is not None:
        return candidate.expected_seconds < bound
    return candidate.model in short_models


def shortness(expected_seconds: float | None, settings: PolicySettings) -> float:
    """The shortest-first term of a job expected to run `expected_seconds`
    (its p50; None: no estimate, no term)."""
    weight = settings.shortest_first_weight
    if weight <= 0 or expected_seconds is None:
        return 0.0
    return weight / (1.0 + max(0.0, expected_seconds) / settings.shortest_first_scale)


# What a GPU has loaded, as affinity sees it: one model, the set of models
# llama-swap keeps loaded together (every `ready` one: a job of any needs no
# load), or nothing.
Loaded = str | frozenset[str] | None


def is_loaded(model: str, loaded: Loaded) -> bool:
    """Whether a job of `model` needs no load where `loaded` is."""
    if loaded is None or isinstance(loaded, str):
        return model == loaded
    return model in loaded


def swap_affinity(
    candidate: Candidate, *, resident_model: Loaded, settings: PolicySettings
) -> float:
    """The bonus of a job whose model is already loaded: running it next saves a swap."""
    return affinity_bonus(
        candidate.model, resident_model=resident_model, bonus=settings.swap_affinity_bonus
    )


def affinity_bonus(model: str, *, resident_model: Loaded, bonus: float) -> float:
    """The rule itself, for callers holding a recorded policy rather than settings
    (`why` replays past decisions). Nothing is resident before the first job, so
    no job has the bonus then."""
    return bonus if is_loaded(model, resident_model) else 0.0


def score(
    candidate: Candidate, *, now: float, resident_model: Loaded, settings: PolicySettings
) -> ScoreTerms:
    affinity = swap_affinity(candidate, resident_model=resident_model, settings=settings)
    aged = max(0.0, now - candidate.eligible_at)
    aging = aged / settings.aging_divisor
    return ScoreTerms(
        band=candidate.band,
        tier_bonus=candidate.tier_bonus,
        swap_affinity=affinity,
        aging=aging,
        effective=candidate.band + candidate.tier_bonus + candidate.shortness + affinity + aging,
        waited_seconds=max(0.0, now - candidate.submitted_at),
        aged_seconds=aged,
        shortness=candidate.shortness,
    )


def rank(
    candidates: Iterable[Candidate],
    *,
    now: float,
    resident_model: Loaded,
    settings: PolicySettings,
    top: int | None = None,
) -> list[RankedCandidate]:
    """Candidates best first; ties go to the earlier job (lower id).

    With `top`, only the first `top`: the others are ordered by their sort
    key alone, without building their terms (the claim ranks a pool of
    heads and keeps a handful)."""
    if top is None:
        ranked = [_ranked(c, now, resident_model, settings) for c in candidates]
        ranked.sort(key=_order)
        return ranked
    first = heapq.nsmallest(
        top, candidates, key=lambda c: (-_sort_key(c, resident_model, settings), c.job_id)
    )
    return [_ranked(c, now, resident_model, settings) for c in first]


def best(
    candidates: Iterable[Candidate],
    *,
    now: float,
    resident_model: Loaded,
    settings: PolicySettings,
) -> RankedCandidate:
    """`rank(...)[0]` without sorting the rest."""
    return min((_ranked(c, now, resident_model, settings) for c in candidates), key=_order)


def _sort_key(candidate: Candidate, resident_model: Loaded, settings: PolicySettings) -> float:
    """rank_key + swap affinity: orders exactly like `effective`, at any `now`."""
    return rank_key(
        band=candidate.band,
        tier_bonus=candidate.tier_bonus,
        eligible_at=candidate.eligible_at,
        aging_divisor=settings.aging_divisor,
        shortness=candidate.shortness,
    ) + swap_affinity(candidate, resident_model=resident_model, settings=settings)


def _ranked(
    candidate: Candidate, now: float, resident_model: Loaded, settings: PolicySettings
) -> RankedCandidate:
    terms = score(candidate, now=now, resident_model=resident_model, settings=settings)
    return RankedCandidate(candidate, terms, _sort_key(candidate, resident_model, settings))


def _order(ranked: RankedCandidate) -> tuple[float, int]:
    return (-ranked.sort_key, ranked.candidate.job_id)


def check_invariant(settings: PolicySettings, tier_bonuses: Mapping[str, float]) -> None:
    """Refuse settings under which a bounded term could cross a band.

    Aging is unbounded on purpose (it is what prevents starvation); every
    other term must stay below the spacing between bands, or a tier bonus
    plus an affinity bonus could lift a batch job over a normal one. The
    bands are where the priority aliases put them, so the spacing checked
    against may not exceed the aliases' spacing.
    """
    if settings.aging_divisor <= 0:
        raise PolicyInvariantError(
            f"aging_divisor must be a positive number of seconds per point, "
            f"got {settings.aging_divisor}"
        )
    if settings.swap_affinity_bonus < 0:
        raise PolicyInvariantError(
            f"swap_affinity_bonus must not be negative, got {settings.swap_affinity_bonus}"
        )
    if settings.shortest_first_weight < 0:
        raise PolicyInvariantError(
            f"shortest_first_weight must not be negative (0: off), "
            f"got {settings.shortest_first_weight}"
        )
    if settings.shortest_first_scale <= 0:
        raise PolicyInvariantError(
            f"shortest_first_scale must be a positive number of seconds, "
            f"got {settings.shortest_first_scale}"
        )
    largest_tier, largest_bonus = max(
        ((name, abs(bonus)) for name, bonus in tier_bonuses.items()),
        key=lambda item: item[1],
        default=("none", 0.0),
    )
    weight = settings.shortest_first_weight
    bounded = largest_bonus + settings.swap_affinity_bonus + weight
    bounded_text = (
        f"the largest tier bonus ({_number(largest_bonus)}, tier {largest_tier}) plus the "
        f"swap affinity bonus ({_number(settings.swap_affinity_bonus)})"
        + (f" plus the shortest-first weight ({_number(weight)})" if weight else "")
        + f" = {_number(bounded)}"
    )
    if settings.band_spacing > ALIAS_SPACING:
        aliases = ", ".join(f"{name} {band}" for name, band in _ALIASES_LOW_TO_HIGH)
        raise PolicyInvariantError(
            f"band spacing {settings.band_spacing} is larger than the {ALIAS_SPACING} points "
            f"between the priority aliases ({aliases}), so it cannot bound {bounded_text}; "
            f"use a band spacing of at most {ALIAS_SPACING}"
        )
    if bounded >= settings.band_spacing:
        remedy = (
            "lower a bonus"
            if settings.band_spacing >= ALIAS_SPACING
            else f"lower a bonus or raise the band spacing (at most {ALIAS_SPACING})"
        )
        raise PolicyInvariantError(
            f"band spacing {settings.band_spacing} must be larger than {bounded_text}; {remedy}"
        )


def _number(value: float) -> str:
    return f"{value:g}"
