"""`manage.py simulate`: its tables and its messages on bad input."""

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from queueapp.simulation.traces import TRACES_DIR

LIVE_CHECK = str(TRACES_DIR / "live-check.jsonl")


def simulate(*args: str) -> str:
    out = StringIO()
    call_command("simulate", *args, stdout=out)
    return out.getvalue()


def test_prints_one_row_per_policy_and_the_terms_that_changed_the_order():
    output = simulate(LIVE_CHECK)
    assert output.startswith("trace live-check: 14 jobs over 1.0 s, 3 members, swap 0.1 s;")
    rows = [line.split("|")[1].strip() for line in output.splitlines() if line.startswith("| ")]
    for policy in ("fifo", "fifo-collate", "model-priority", "strict-priority", "gpusched"):
        assert policy in rows
    assert "Wait per band and tier (mean / p95 / max)" in output
    assert "| interactive | free | 1" in output
    assert "gpusched: dispatches whose order a term changed" in output
    assert "simulated in" in output


def test_policy_option_runs_only_that_policy():
    output = simulate(LIVE_CHECK, "--policy", "gpusched")
    assert "| gpusched " in output and "| fifo " not in output


def test_sweep_prints_one_row_per_combination():
    output = simulate(LIVE_CHECK, "--sweep", "aging_divisor=30,60", "swap_affinity_bonus=0,5,10")
    assert "gpusched, each combination of the swept settings" in output
    table = [line for line in output.splitlines() if line.startswith("| ")]
    assert table[0].split("|")[1:3] == [" aging_divisor ", " swap_affinity_bonus "]
    assert len(table) == 1 + 6


def test_missing_trace_file():
    with pytest.raises(CommandError, match="trace file not found: /nonexistent/day.jsonl"):
        simulate("/nonexistent/day.jsonl")


def test_bad_sweep_syntax():
    with pytest.raises(CommandError, match="bad sweep argument 'aging_divisor': expected NAME="):
        simulate(LIVE_CHECK, "--sweep", "aging_divisor")
    with pytest.raises(CommandError, match="unknown setting 'divisor' in --sweep"):
        simulate(LIVE_CHECK, "--sweep", "divisor=30,60")
    with pytest.raises(CommandError, match="aging_divisor: 'x' is not a number"):
        simulate(LIVE_CHECK, "--sweep", "aging_divisor=30,x")


def test_settings_that_break_the_invariant_are_refused():
    with pytest.raises(CommandError, match="band spacing 100 must be larger"):
        simulate(LIVE_CHECK, "--swap-affinity-bonus", "98")
    with pytest.raises(CommandError, match="refused: band spacing 100 must be larger"):
        simulate(LIVE_CHECK, "--sweep", "swap_affinity_bonus=10,98")


def test_a_broken_trace_names_the_line(tmp_path):
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"trace": "x", "members": {"ann": "free"}}\n{"id": "1", "member": "ann"\n')
    with pytest.raises(CommandError, match=r"broken.jsonl:2: not JSON"):
        simulate(str(broken))


def test_unknown_policy_is_refused():
    with pytest.raises(CommandError, match="invalid choice: 'lifo'"):
        simulate(LIVE_CHECK, "--policy", "lifo")
