"""Explanations: what each term did to a decision.

`counterfactual_winners` answers "who would have gone first without this
term?" for every term; a term *changed the order* when that winner differs
from the real one. `deciding_term` names the term that put one job ahead of
another.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from queueapp.policy.score import (
    Candidate,
    Loaded,
    PolicySettings,
    ScoreTerms,
    rank_key,
    swap_affinity,
)

TERMS = ("aging", "swap_affinity", "tier_bonus", "fairness")
# A term of its own only where the policy turns shorter-first on.
SHORTNESS = "shortness"


def counterfactual_winners(
    candidates: Sequence[Candidate],
    *,
    now: float,
    resident_model: Loaded,
    settings: PolicySettings,
) -> dict[str, int]:
    """The job that would have won with each term removed.

    Without fairness, every job ages from its submission (no lane clock).
    Each winner is `best(...)` of the pool with that term removed; this
    computes the same sort keys, with the same arithmetic, without building
    the terms of every candidate four times (it runs in every claim).
    Shortness is among the terms only when a candidate has some.
    """
    divisor = settings.aging_divisor

    def affinity(candidate: Candidate) -> float:
        return swap_affinity(candidate, resident_model=resident_model, settings=settings)

    keys: dict[str, Callable[[Candidate], float]] = {
        "aging": lambda c: (
            rank_key(
                band=c.band,
                tier_bonus=c.tier_bonus,
                eligible_at=c.eligible_at,
                aging_divisor=math.inf,
                shortness=c.shortness,
            )
            + affinity(c)
        ),
        "swap_affinity": lambda c: (
            rank_key(
                band=c.band,
                tier_bonus=c.tier_bonus,
                eligible_at=c.eligible_at,
                aging_divisor=divisor,
                shortness=c.shortness,
            )
            + 0.0
        ),
        "tier_bonus": lambda c: (
            rank_key(
                band=c.band,
                tier_bonus=0.0,
                eligible_at=c.eligible_at,
                aging_divisor=divisor,
                shortness=c.shortness,
            )
            + affinity(c)
        ),
        "fairness": lambda c: (
            rank_key(
                band=c.band,
                tier_bonus=c.tier_bonus,
                eligible_at=c.submitted_at,
                aging_divisor=divisor,
                shortness=c.shortness,
            )
            + affinity(c)
        ),
    }
    if any(c.shortness for c in candidates):
        keys[SHORTNESS] = lambda c: (
            rank_key(
                band=c.band,
                tier_bonus=c.tier_bonus,
                eligible_at=c.eligible_at,
                aging_divisor=divisor,
            )
            + affinity(c)
        )
    return {term: _first_by(candidates, key) for term, key in keys.items()}


def _first_by(candidates: Sequence[Candidate], key: Callable[[Candidate], float]) -> int:
    """The job `best()` would pick by this sort key: highest key, then oldest id."""
    return min(candidates, key=lambda c: (-key(c), c.job_id)).job_id


def deciding_term(winner: ScoreTerms, loser: ScoreTerms, *, aging_divisor: float) -> str:
    """The term that put `winner` ahead of `loser`.

    A higher band decides by itself (bounded terms never cross a band). A
    lower band can only win by aging. Inside a band, the term with the
    largest difference in the winner's favour decides; "fairness" when it is
    aging and the loser would have won had its own member's jobs not reset
    its clock; "submission order" when every term is equal.
    """
    if winner.band > loser.band:
        return "band"
    if winner.band < loser.band:
        return "aging"
    differences = {
        "tier_bonus": winner.tier_bonus - loser.tier_bonus,
        "swap_affinity": winner.swap_affinity - loser.swap_affinity,
        "aging": winner.aging - loser.aging,
        SHORTNESS: winner.shortness - loser.shortness,
    }
    term, difference = max(differences.items(), key=lambda item: item[1])
    if difference <= 1e-9:
        return "submission order"
    if term == "aging" and loser.aged_seconds < loser.waited_seconds:
        unfair_aging = loser.waited_seconds / aging_divisor
        if loser.effective - loser.aging + unfair_aging > winner.effective:
            return "fairness"
    return term
