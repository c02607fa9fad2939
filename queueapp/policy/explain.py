"""Explanations: what each term did to a decision.

`counterfactual_winners` answers "who would have gone first without this
term?" for every term; a term *changed the order* when that winner differs
from the real one. `deciding_term` names the term that put one job ahead of
another.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from queueapp.policy.score import Candidate, PolicySettings, ScoreTerms, best

TERMS = ("aging", "swap_affinity", "tier_bonus", "fairness")


def counterfactual_winners(
    candidates: Sequence[Candidate],
    *,
    now: float,
    resident_model: str | None,
    settings: PolicySettings,
) -> dict[str, int]:
    """The job that would have won with each term removed.

    Without fairness, every job ages from its submission (no lane clock).
    """
    variants: dict[str, tuple[Sequence[Candidate], PolicySettings]] = {
        "aging": (candidates, replace(settings, aging_divisor=math.inf)),
        "swap_affinity": (candidates, replace(settings, swap_affinity_bonus=0.0)),
        "tier_bonus": ([replace(c, tier_bonus=0.0) for c in candidates], settings),
        "fairness": ([replace(c, eligible_at=c.submitted_at) for c in candidates], settings),
    }
    return {
        term: best(pool, now=now, resident_model=resident_model, settings=variant).candidate.job_id
        for term, (pool, variant) in variants.items()
    }


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
    }
    term, difference = max(differences.items(), key=lambda item: item[1])
    if difference <= 1e-9:
        return "submission order"
    if term == "aging" and loser.aged_seconds < loser.waited_seconds:
        unfair_aging = loser.waited_seconds / aging_divisor
        if loser.effective - loser.aging + unfair_aging > winner.effective:
            return "fairness"
    return term
