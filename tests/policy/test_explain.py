"""Counterfactual winners and the deciding term, as plain functions."""

import pytest

from queueapp.policy import (
    Candidate,
    PolicySettings,
    counterfactual_winners,
    deciding_term,
    rank,
)

NOW = 1_800_000_000.0
DEFAULT = PolicySettings()


def job(job_id, band=0, bonus=0.0, model="a", waited=0.0, aged=None, member=None):
    submitted = NOW - waited
    eligible = NOW - (waited if aged is None else aged)
    return Candidate(job_id, band, bonus, model, submitted, eligible, member_id=member or job_id)


def winners(candidates, resident="a", settings=DEFAULT):
    return counterfactual_winners(candidates, now=NOW, resident_model=resident, settings=settings)


def test_each_term_is_removed_in_turn():
    tier = [job(1, bonus=0, waited=30), job(2, bonus=2, waited=0)]
    assert winners(tier)["tier_bonus"] == 1  # the pro job wins only by its bonus
    assert winners(tier)["swap_affinity"] == 2

    affinity = [job(1, model="b", waited=120), job(2, model="a")]
    assert winners(affinity)["swap_affinity"] == 1

    aging = [job(1, band=-100, waited=201 * 60), job(2, band=100)]
    assert winners(aging)["aging"] == 2

    # Job 1's member just had a job run (its clock restarted); job 2 is newer.
    fairness = [job(1, waited=600, aged=0), job(2, waited=60)]
    assert winners(fairness)["fairness"] == 1
    assert rank(fairness, now=NOW, resident_model="a", settings=DEFAULT)[0].candidate.job_id == 2


def terms_of(candidate, resident="a"):
    return rank([candidate], now=NOW, resident_model=resident, settings=DEFAULT)[0].terms


@pytest.mark.parametrize(
    ("winner", "loser", "term"),
    [
        (job(1, band=100), job(2, band=0, waited=3000), "band"),
        (job(1, band=-100, waited=13000), job(2, band=100), "aging"),
        (job(1, bonus=2), job(2, bonus=0), "tier_bonus"),
        (job(1, model="a"), job(2, model="b", waited=60), "swap_affinity"),
        (job(1, waited=300), job(2, waited=10), "aging"),
        (job(1, waited=100), job(2, waited=600, aged=0), "fairness"),
        (job(1), job(2), "submission order"),
    ],
)
def test_deciding_term(winner, loser, term):
    assert deciding_term(terms_of(winner), terms_of(loser), aging_divisor=60) == term
