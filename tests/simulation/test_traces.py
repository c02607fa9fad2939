"""Trace files: reproducible from a seed, checked when read."""

import json

import pytest

from queueapp.simulation.traces import TRACES_DIR, TraceError, dump_trace, load_trace
from queueapp.simulation.traces.generators import GENERATORS, write_all
from tests.simulation.helpers import job, trace


def test_the_committed_traces_are_the_generators_output_for_seed_1(tmp_path):
    written = write_all(seed=1, out=tmp_path)
    assert [path.name for path in written] == [f"{name}.jsonl" for name in GENERATORS]
    for path in written:
        assert path.read_text() == (TRACES_DIR / path.name).read_text(), path.name


def test_another_seed_gives_another_day():
    assert GENERATORS["studio-day"](2).jobs != GENERATORS["studio-day"](1).jobs


def test_the_studio_day_has_what_the_benchmark_needs():
    day = load_trace(TRACES_DIR / "studio-day.jsonl")
    film = [job for job in day.jobs if job.chain == "film"]
    assert len(film) == 174 and {job.seconds for job in film} == {240.0}
    assert all(job.after for job in film[1:])  # one at a time
    kinds = {job.kind for job in day.jobs}
    assert {"image", "video", "tool", "film-shot"} <= kinds
    assert set(day.members.values()) == {"free", "pro", "max"}
    assert len(day.jobs) < 3000
    images = [job.seconds for job in day.jobs if job.kind == "image"]
    videos = [job.seconds for job in day.jobs if job.kind == "video"]
    assert 5 <= min(images) and max(images) <= 40
    assert 240 <= min(videos) and max(videos) <= 960


def test_dump_and_load_round_trip(tmp_path):
    original = trace(
        job("a", at=1.5, priority="batch", chain="c"),
        job("b", at=None, after="a", delay=2.0, member="bo", chain="c"),
        model_priority={"a": 1},
    )
    path = tmp_path / "t.jsonl"
    dump_trace(original, path)
    assert load_trace(path) == original


HEADER = json.dumps({"trace": "t", "members": {"bo": "pro"}})
JOB = '{"id": "1", "member": "bo", "model": "a", '


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ([], "empty file"),
        (['{"id": "1"}'], ":1: the first line must be the header"),
        (['{"trace": "t", "members": {"ann": "gold"}}'], "member 'ann' has unknown tier 'gold'"),
        (["[1]"], ":1: expected a JSON object"),
        ([HEADER, "{"], ":2: not JSON"),
        ([HEADER, '{"id": "1", "member": "ann", "model": "a", "at": 0}'], ":2: member 'ann'"),
        ([HEADER, JOB + '"priority": null}'], ":2: a job needs exactly one of 'at' and 'after'"),
        ([HEADER, '{"id": "1", "member": "bo", "at": 0}'], ":2: model is required"),
        ([HEADER, JOB + '"at": -1}'], ":2: at must be a number >= 0"),
        ([HEADER, JOB + '"at": 0, "priority": 100}'], ":2: priority is the header's text"),
        ([HEADER, JOB + '"after": "9"}'], "job '1' comes after unknown job '9'"),
        ([HEADER, JOB + '"at": 0}', JOB + '"at": 1}'], "job id '1' appears twice"),
        (
            [HEADER, JOB + '"after": "2"}', JOB.replace('"1"', '"2"') + '"after": "1"}'],
            "in a cycle of 'after' references",
        ),
    ],
)
def test_load_refuses_a_broken_trace_naming_the_line(tmp_path, lines, message):
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceError, match=message):
        load_trace(path)
