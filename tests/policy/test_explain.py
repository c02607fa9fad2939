"""Counterfactual winners and the deciding term, as plain functions."""

import math
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from queueapp.policy import (
    PolicySettings,
    counterfactual_winners,
    deciding_term,
    rank,
)
from queueapp.policy.score import best
from tests.factories import NOW, candidate

DEFAULT = PolicySettings()


def winners(candidates, resident="a", settings=DEFAULT):
    return counterfactual_winners(candidates, now=NOW, resident_model=resident, settings=settings)


def test_each_term_is_removed_in_turn():
    tier = [candidate(1, tier_bonus=0, waited=30), candidate(2, tier_bonus=2, waited=0)]
    assert winners(tier)["tier_bonus"] == 1  # the pro job wins only by its bonus
    assert winners(tier)["swap_affinity"] == 2

    affinity = [candidate(1, model="b", waited=120), candidate(2, model="a")]
    assert winners(affinity)["swap_affinity"] == 1

    aging = [candidate(1, band=-100, waited=201 * 60), candidate(2, band=100)]
    assert winners(aging)["aging"] == 2

    # Job 1's member just had a job run (its clock restarted); job 2 is newer.
    fairness = [candidate(1, waited=600, aged=0), candidate(2, waited=60)]
    assert winners(fairness)["fairness"] == 1
    assert rank(fairness, now=NOW, resident_model="a", settings=DEFAULT)[0].candidate.job_id == 2


def terms_of(candidate, resident="a"):
    return rank([candidate], now=NOW, resident_model=resident, settings=DEFAULT)[0].terms


@pytest.mark.parametrize(
    ("winner", "loser", "term"),
    [
        (candidate(1, band=100), candidate(2, band=0, waited=3000), "band"),
        (candidate(1, band=-100, waited=13000), candidate(2, band=100), "aging"),
        (candidate(1, tier_bonus=2), candidate(2, tier_bonus=0), "tier_bonus"),
        (candidate(1, model="a"), candidate(2, model="b", waited=60), "swap_affinity"),
        (candidate(1, waited=300), candidate(2, waited=10), "aging"),
        (candidate(1, waited=100), candidate(2, waited=600, aged=0), "fairness"),
        (candidate(1), candidate(2), "submission order"),
    ],
)
def test_deciding_term(winner, loser, term):
    assert deciding_term(terms_of(winner), terms_of(loser), aging_divisor=60) == term


def reference_winners(candidates, *, now, resident_model, settings):
    """The definition: `best` of the pool with each term taken out."""
    variants = {
        "aging": (candidates, replace(settings, aging_divisor=math.inf)),
        "swap_affinity": (candidates, replace(settings, swap_affinity_bonus=0.0)),
        "tier_bonus": ([replace(c, tier_bonus=0.0) for c in candidates], settings),
        "fairness": ([replace(c, eligible_at=c.submitted_at) for c in candidates], settings),
    }
    return {
        term: best(pool, now=now, resident_model=resident_model, settings=variant).candidate.job_id
        for term, (pool, variant) in variants.items()
    }


@st.composite
def pools(draw):
    size = draw(st.integers(min_value=1, max_value=12))
    candidates = []
    for job_id in range(1, size + 1):
        waited = draw(st.floats(min_value=0, max_value=50_000, allow_nan=False))
        aged = draw(st.floats(min_value=0, max_value=waited, allow_nan=False))
        candidates.append(
            candidate(
                job_id,
                band=draw(st.sampled_from([-100, 0, 5, 100])),
                tier_bonus=draw(st.sampled_from([0.0, 1.0, 2.0])),
                model=draw(st.sampled_from(["a", "b", "c"])),
                waited=waited,
                aged=aged,
                member=draw(st.integers(min_value=1, max_value=4)),
            )
        )
    return candidates


@given(
    candidates=pools(),
    resident=st.sampled_from(["a", "b", None]),
    divisor=st.sampled_from([0.01, 1.0, 60.0, 3600.0]),
)
def test_the_fast_counterfactuals_are_the_definition(candidates, resident, divisor):
    settings = PolicySettings(aging_divisor=divisor)
    arguments = {"now": NOW, "resident_model": resident, "settings": settings}
    assert counterfactual_winners(candidates, **arguments) == reference_winners(
        candidates, **arguments
    )


@given(
    candidates=pools(),
    resident=st.sampled_from(["a", None]),
    top=st.integers(min_value=1, max_value=14),
)
def test_ranking_only_the_top_gives_the_same_first_places(candidates, resident, top):
    arguments = {"now": NOW, "resident_model": resident, "settings": DEFAULT}
    assert rank(candidates, top=top, **arguments) == rank(candidates, **arguments)[:top]
