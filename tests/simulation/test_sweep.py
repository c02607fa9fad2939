"""Parsing `--sweep` and running it."""

import pytest

from queueapp.policy import PolicySettings
from queueapp.simulation.sweep import SweepError, parse_sweep, run_sweep, sweep_settings
from tests.simulation.helpers import job, trace


def test_parse_sweep_reads_names_and_values_in_order():
    assert parse_sweep(["aging_divisor=30,60,120", "swap_affinity_bonus=0,5,10"]) == {
        "aging_divisor": [30.0, 60.0, 120.0],
        "swap_affinity_bonus": [0.0, 5.0, 10.0],
    }
    assert parse_sweep(["band_spacing=100,200"]) == {"band_spacing": [100, 200]}


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["aging_divisor"], "bad sweep argument 'aging_divisor': expected NAME=V1,V2"),
        (["=30"], "bad sweep argument '=30'"),
        (["aging_divisor="], "bad sweep argument 'aging_divisor='"),
        (["aging=30"], "unknown setting 'aging' in --sweep; choose from aging_divisor"),
        (["aging_divisor=30,fast"], "aging_divisor: 'fast' is not a number"),
        (["aging_divisor=30,,60"], "aging_divisor: '' is not a number"),
        (["band_spacing=100.5"], "band_spacing: '100.5' is not a whole number"),
        (["aging_divisor=30", "aging_divisor=60"], "aging_divisor is given twice"),
        ([], "--sweep needs at least one NAME=V1,V2"),
    ],
)
def test_parse_sweep_refuses_bad_syntax_with_a_message(arguments, message):
    with pytest.raises(SweepError, match=message.replace("(", r"\(").replace("+", r"\+")):
        parse_sweep(arguments)


def test_sweep_settings_is_the_grid_with_the_first_setting_varying_slowest():
    grid = sweep_settings({"aging_divisor": [30.0, 60.0], "swap_affinity_bonus": [0.0, 5.0]})
    assert [(s.aging_divisor, s.swap_affinity_bonus) for s in grid] == [
        (30.0, 0.0),
        (30.0, 5.0),
        (60.0, 0.0),
        (60.0, 5.0),
    ]
    assert all(s.band_spacing == 100 for s in grid)


def test_run_sweep_gives_one_summary_per_settings():
    tr = trace(job("a", model="a"), job("b", model="b"), job("a2", model="a"))
    results = run_sweep(tr, sweep_settings({"swap_affinity_bonus": [0.0, 10.0]}))
    assert [summary.swaps for _, summary in results] == [3, 2]


def test_run_sweep_refuses_settings_that_break_the_invariant():
    tr = trace(job("a"))
    with pytest.raises(
        SweepError,
        match=r"swap_affinity_bonus=99, band_spacing=100, shortest_first_weight=0, "
        r"shortest_first_scale=60 are refused: band spacing 100 must",
    ):
        run_sweep(tr, [PolicySettings(swap_affinity_bonus=99.0)])
    with pytest.raises(SweepError, match="aging_divisor must be a positive number"):
        run_sweep(tr, [PolicySettings(aging_divisor=0.0)])
