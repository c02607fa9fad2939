"""The swap affinity bonus: one rule, which every score of a job agrees with."""

from hypothesis import given
from hypothesis import strategies as st

from queueapp.policy import PolicySettings, rank, rank_key, score, swap_affinity
from tests.factories import NOW, candidate

DEFAULT = PolicySettings()


def job(job_id, model, waited=0.0, band=0, bonus=0.0):
    return candidate(job_id, band, bonus, model, waited)


def test_only_a_job_of_the_resident_model_gets_the_bonus():
    assert swap_affinity(job(1, "a"), resident_model="a", settings=DEFAULT) == 10.0
    assert swap_affinity(job(1, "b"), resident_model="a", settings=DEFAULT) == 0.0


def test_no_job_gets_the_bonus_before_a_model_is_loaded():
    assert swap_affinity(job(1, "a"), resident_model=None, settings=DEFAULT) == 0.0


@given(
    models=st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=8),
    waits=st.lists(st.floats(min_value=0, max_value=50_000), min_size=8, max_size=8),
    resident=st.sampled_from(["a", "b", None]),
    bonus=st.sampled_from([0.0, 2.5, 10.0, 99.0]),
)
def test_the_score_and_the_rank_order_add_the_same_affinity(models, waits, resident, bonus):
    settings = PolicySettings(swap_affinity_bonus=bonus)
    candidates = [job(i, model, waited=waits[i]) for i, model in enumerate(models)]
    for ranked in rank(candidates, now=NOW, resident_model=resident, settings=settings):
        c = ranked.candidate
        affinity = swap_affinity(c, resident_model=resident, settings=settings)
        assert affinity == (bonus if c.model == resident else 0.0)
        assert ranked.terms.swap_affinity == affinity
        assert score(c, now=NOW, resident_model=resident, settings=settings) == ranked.terms
        key = rank_key(
            band=c.band,
            tier_bonus=c.tier_bonus,
            eligible_at=c.eligible_at,
            aging_divisor=settings.aging_divisor,
        )
        assert ranked.sort_key == key + affinity
