"""The two-GPU studio day and the tiers' running limit in trace files."""

import json
from dataclasses import replace

import pytest

from queueapp.simulation.traces import TRACES_DIR, Tier, TraceError, dump_trace, load_trace
from queueapp.simulation.traces.generators import studio_day
from tests.simulation.helpers import job, trace


def test_the_two_gpu_day_is_the_studio_day_twice_as_busy_with_a_second_film():
    one = studio_day(1)
    two = load_trace(TRACES_DIR / "studio-day-2gpu.jsonl")
    assert two.name == "studio-day-2gpu" and two.members == one.members
    # Poisson arrivals at twice the rates (videos are too few to compare alone).
    for kinds in ({"image"}, {"tool"}, {"image", "video", "tool"}):
        ones = sum(1 for j in one.jobs if j.kind in kinds)
        twos = sum(1 for j in two.jobs if j.kind in kinds)
        assert 1.8 * ones < twos < 2.2 * ones, kinds
    chains = {j.chain for j in two.jobs if j.chain}
    assert chains == {"film", "sequel"}
    for name, member in (("film", "mira"), ("sequel", "gus")):
        shots = [j for j in two.jobs if j.chain == name]
        assert len(shots) == 174 and {j.member for j in shots} == {member}
        assert all(j.after for j in shots[1:]) and {j.priority for j in shots} == {"batch"}


def test_a_tiers_running_limit_is_written_only_when_it_is_not_one(tmp_path):
    default = trace(job("a"))
    path = tmp_path / "t.jsonl"
    dump_trace(default, path)
    header = json.loads(path.read_text().splitlines()[0])
    assert "max_running_jobs" not in header["tiers"]["free"]
    two = replace(default, tiers={**default.tiers, "free": Tier(0.0, 100, -1000, 2)})
    dump_trace(two, path)
    assert json.loads(path.read_text().splitlines()[0])["tiers"]["free"]["max_running_jobs"] == 2
    assert load_trace(path) == two
    free = json.loads(path.read_text().splitlines()[0])["tiers"]["free"]
    assert "strict_running_limit" not in free
    strict = replace(default, tiers={**default.tiers, "free": Tier(0.0, 100, -1000, 1, True)})
    dump_trace(strict, path)
    assert json.loads(path.read_text().splitlines()[0])["tiers"]["free"]["strict_running_limit"]
    assert load_trace(path) == strict


def test_a_running_limit_below_one_is_refused(tmp_path):
    path = tmp_path / "t.jsonl"
    header = {
        "trace": "t",
        "members": {"ann": "free"},
        "tiers": {"free": {"bonus": 0, "cap": 100, "floor": -1000, "max_running_jobs": 0}},
    }
    path.write_text(json.dumps(header) + "\n")
    with pytest.raises(TraceError, match="tier 'free': max_running_jobs must be at least 1"):
        load_trace(path)
