"""The score, the invariant and the ranking, as plain functions."""

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from queueapp.policy import (
    PolicyInvariantError,
    PolicySettings,
    check_invariant,
    rank,
)
from tests.factories import NOW, candidate

DEFAULT = PolicySettings()


def order(candidates, resident="a", settings=DEFAULT, now=NOW):
    ranked = rank(candidates, now=now, resident_model=resident, settings=settings)
    return [r.candidate.job_id for r in ranked]


def test_s1_tiers_order_within_batch_and_below_normal():
    jobs = [
        candidate(1, -100, 0),  # free batch
        candidate(2, -100, 1),  # pro batch
        candidate(3, -100, 2),  # max batch
        candidate(4, 0, 0),  # free normal
    ]
    ranked = rank(jobs, now=NOW, resident_model="a", settings=DEFAULT)
    assert [r.candidate.job_id for r in ranked] == [4, 3, 2, 1]
    assert [r.terms.band + r.terms.tier_bonus for r in ranked[1:]] == [-98, -99, -100]


def test_s2_batch_wins_only_after_the_band_gap_in_aging():
    threshold = (100 - (-98)) * 60  # 3.3 hours
    assert threshold == 11880
    fresh_interactive = candidate(1, 100, 0)
    just_before = candidate(2, -100, 2, waited=threshold - 1)
    just_after = candidate(3, -100, 2, waited=threshold + 1)
    assert order([fresh_interactive, just_before]) == [1, 2]
    assert order([fresh_interactive, just_after]) == [3, 1]


def test_s3_affinity_breaks_a_near_tie():
    b_waiting_longer = candidate(1, 0, model="b", waited=120)
    a_resident = candidate(2, 0, model="a", waited=0)
    assert order([b_waiting_longer, a_resident], resident="a") == [2, 1]


def test_s3b_affinity_never_crosses_a_band():
    b_interactive = candidate(1, 100, model="b")
    a_batch = candidate(2, -100, 2, model="a")
    assert order([a_batch, b_interactive], resident="a") == [1, 2]


def test_s5_aging_is_unbounded_so_batch_eventually_wins():
    batch = candidate(1, -100, waited=200 * 60 + 1)
    interactive = candidate(2, 100)
    assert order([interactive, batch]) == [1, 2]


def test_terms_are_reported_separately_and_add_up():
    [ranked] = rank(
        [candidate(7, 0, 1, model="a", waited=90)], now=NOW, resident_model="a", settings=DEFAULT
    )
    terms = ranked.terms
    assert (terms.band, terms.tier_bonus, terms.swap_affinity) == (0, 1, 10)
    assert terms.aging == pytest.approx(1.5)
    assert terms.effective == pytest.approx(12.5)


def test_fractional_divisor():
    [ranked] = rank(
        [candidate(1, 0, waited=3)],
        now=NOW,
        resident_model=None,
        settings=PolicySettings(aging_divisor=0.5),
    )
    assert ranked.terms.aging == pytest.approx(6)


def test_ties_go_to_the_earlier_job():
    assert order([candidate(9, 0), candidate(3, 0)]) == [3, 9]


def test_invariant_refuses_bonuses_that_reach_the_band_spacing():
    check_invariant(DEFAULT, {"free": 0, "pro": 1, "max": 2})
    with pytest.raises(PolicyInvariantError, match=r"tier bonus \(90, tier max\).*= 100"):
        check_invariant(DEFAULT, {"free": 0, "max": 90})
    with pytest.raises(PolicyInvariantError, match="aging_divisor"):
        check_invariant(PolicySettings(aging_divisor=0), {})
    with pytest.raises(PolicyInvariantError, match="swap affinity"):
        check_invariant(PolicySettings(swap_affinity_bonus=99), {"max": 2})


def test_band_spacing_above_the_aliases_spacing_is_refused_with_the_numbers():
    loose = PolicySettings(band_spacing=1000, swap_affinity_bonus=150)
    # What the refusal prevents: the batch job of the loaded model ahead of a normal job.
    assert order([candidate(1, 0, model="b"), candidate(2, -100, model="a")], settings=loose) == [
        2,
        1,
    ]
    with pytest.raises(
        PolicyInvariantError,
        match=r"band spacing 1000 is larger than the 100 points between the priority aliases "
        r"\(batch -100, normal 0, interactive 100\).*swap affinity bonus \(150\) = 152; "
        r"use a band spacing of at most 100",
    ):
        check_invariant(loose, {"free": 0, "max": 2})
    with pytest.raises(PolicyInvariantError, match="band spacing 101 is larger than the 100"):
        check_invariant(PolicySettings(band_spacing=101), {"max": 2})


def test_a_band_spacing_up_to_the_aliases_spacing_is_accepted():
    check_invariant(PolicySettings(band_spacing=100, swap_affinity_bonus=97), {"max": 2})
    check_invariant(PolicySettings(band_spacing=20, swap_affinity_bonus=17), {"max": 2})
    with pytest.raises(
        PolicyInvariantError, match=r"= 21; lower a bonus or raise the band spacing \(at most 100\)"
    ):
        check_invariant(PolicySettings(band_spacing=20, swap_affinity_bonus=19), {"max": 2})


bands = st.sampled_from([-100, 0, 100])
bonuses = st.sampled_from([0.0, 1.0, 2.0])
models = st.sampled_from(["a", "b"])
waits = st.floats(min_value=0, max_value=24 * 3600, allow_nan=False)


@given(bands, bands, bonuses, bonuses, models, models, st.sampled_from(["a", "b", None]))
def test_bounded_terms_never_reorder_bands(band1, band2, bonus1, bonus2, model1, model2, resident):
    """With equal waits, the higher band always wins, whatever tier and affinity say."""
    assume(band1 != band2)
    jobs = [candidate(1, band1, bonus1, model1), candidate(2, band2, bonus2, model2)]
    expected = [1, 2] if band1 > band2 else [2, 1]
    assert order(jobs, resident=resident) == expected


@given(
    st.sampled_from([-100, 0]),
    bonuses,
    bonuses,
    st.floats(min_value=0.5, max_value=600, allow_nan=False),
    st.floats(min_value=-3600, max_value=3600, allow_nan=False),
)
def test_aging_crosses_a_band_exactly_when_the_wait_exceeds_the_gap(
    low_band, low_bonus, high_bonus, divisor, offset
):
    high_band = low_band + 100
    gap = (high_band + high_bonus) - (low_band + low_bonus)
    extra_wait = gap * divisor + offset
    assume(abs(offset) > 1e-6 * divisor * max(1.0, gap))
    assume(extra_wait >= 0)
    settings = PolicySettings(aging_divisor=divisor)
    low = candidate(1, low_band, low_bonus, waited=extra_wait)
    high = candidate(2, high_band, high_bonus, waited=0)
    winner = order([high, low], resident=None, settings=settings)[0]
    assert winner == (1 if offset > 0 else 2)


@given(st.lists(st.tuples(bands, bonuses, models, waits), min_size=1, max_size=30), models)
def test_ranking_orders_by_effective_score(specs, resident):
    jobs = [candidate(i, *spec) for i, spec in enumerate(specs)]
    ranked = rank(jobs, now=NOW, resident_model=resident, settings=DEFAULT)
    effective = [r.terms.effective for r in ranked]
    assert all(a >= b - 1e-6 for a, b in zip(effective, effective[1:], strict=False))


@given(
    st.integers(min_value=1, max_value=5000),
    st.floats(min_value=0, max_value=5000, allow_nan=False),
    st.floats(min_value=-5000, max_value=5000, allow_nan=False),
    bands,
    bands,
    models,
    models,
)
def test_settings_the_invariant_accepts_never_reorder_the_alias_bands(
    spacing, affinity, top_bonus, band1, band2, model1, model2
):
    """Whatever the operator sets, if the check lets it through, the aliases keep their order."""
    assume(band1 != band2)
    settings = PolicySettings(band_spacing=spacing, swap_affinity_bonus=affinity)
    bonuses = {"free": 0.0, "top": top_bonus}
    try:
        check_invariant(settings, bonuses)
    except PolicyInvariantError:
        return
    jobs = [candidate(1, band1, top_bonus, model1), candidate(2, band2, 0.0, model2)]
    expected = [1, 2] if band1 > band2 else [2, 1]
    assert order(jobs, resident="a", settings=settings) == expected
