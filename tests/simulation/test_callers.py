"""Callers in the replay: wait bounds that expire queued jobs, and callers
who leave mid-run (a chat closed, an image drained)."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from queueapp.simulation.callers import Callers, on_caller_gone
from queueapp.simulation.cluster_policies import compare_on_gpus
from queueapp.simulation.metrics import summarize
from queueapp.simulation.traces import TRACES_DIR
from tests.simulation.helpers import job, trace

EVERY_CALLER_LEAVES = Callers(leave_share=1.0, leave_at=0.5)


def test_a_queued_job_expires_when_its_bound_passes_and_never_runs():
    tr = trace(
        job("render", priority="batch", seconds=100),
        job("patient", at=1, member="bo", seconds=5),
    )
    (bounded,) = compare_on_gpus(tr, 1, ["gpusched"], callers=Callers(max_wait=30))
    assert [d.job.job.id for d in bounded.dispatches] == ["render"]
    assert [(q.job.id, at) for q, at in bounded.expired] == [("patient", 31.0)]
    assert summarize(bounded).expired == {0: 1}  # one job of band 0
    (in_time,) = compare_on_gpus(tr, 1, ["gpusched"], callers=Callers(max_wait=200))
    assert [d.job.job.id for d in in_time.dispatches] == ["render", "patient"]
    assert in_time.expired == []


def test_a_job_that_starts_at_its_deadline_made_it():
    tr = trace(job("first", seconds=25), job("second", at=0, seconds=5))
    (run,) = compare_on_gpus(tr, 1, ["gpusched"], callers=Callers(max_wait=30))
    # The first runs swap 5 + 25 s: the second starts at 30.0, its deadline.
    assert [(d.job.job.id, d.started_at) for d in run.dispatches] == [
        ("first", 0.0),
        ("second", 30.0),
    ]
    assert run.expired == []


def test_a_chat_whose_caller_leaves_is_closed_and_frees_its_gpu_at_once():
    tr = trace(
        job("chat", priority="interactive", model="chat-small", seconds=20, kind="chat"),
        job("next", at=1, member="bo", model="chat-small", seconds=5),
    )
    (run,) = compare_on_gpus(tr, 1, ["gpusched"], callers=EVERY_CALLER_LEAVES)
    chat, following = run.dispatches
    assert chat.caller_left_at == chat.finished_at == chat.started_at + 12.5  # swap 5 + run 20
    assert chat.drained_seconds == 0.0
    assert following.started_at == chat.finished_at


def test_an_image_whose_caller_leaves_is_drained_and_holds_its_gpu_to_the_end():
    tr = trace(
        job("image", priority="interactive", model="image-xl", seconds=20, kind="image"),
        job("next", at=1, member="bo", model="image-xl", seconds=5),
    )
    (run,) = compare_on_gpus(tr, 1, ["gpusched"], callers=EVERY_CALLER_LEAVES)
    image, following = run.dispatches
    assert image.finished_at == image.started_at + 25.0  # swap 5 + run 20: rendered to its end
    assert image.caller_left_at == image.started_at + 12.5
    assert image.drained_seconds == 12.5
    assert following.started_at == image.finished_at  # never beside the render
    summary = summarize(run)
    assert (summary.callers_left, summary.drained_seconds) == (1, 12.5)


def test_who_bounds_and_who_leaves_is_drawn_from_the_id_the_same_every_run():
    jobs = [job(f"j{n:03d}", kind="image") for n in range(400)]
    half = Callers(max_wait=10, bounded_share=0.5, leave_share=0.5)
    bounded = [j.id for j in jobs if half.bound_of(j) is not None]
    assert 150 < len(bounded) < 250
    assert bounded == [j.id for j in jobs if half.bound_of(j) is not None]
    assert all(Callers(max_wait=10).bound_of(j) == 10 for j in jobs)
    assert not any(Callers(max_wait=10, bounded_share=0).bound_of(j) for j in jobs)
    assert not any(half.leaves(j, top_band=False) for j in jobs)
    assert on_caller_gone(job("c", model="chat-small")) == "close"
    assert on_caller_gone(job("t", model="x", kind="tool")) == "close"
    assert on_caller_gone(job("i", model="image-xl", kind="image")) == "drain"


def simulate(*args: str) -> str:
    out = StringIO()
    call_command("simulate", *args, stdout=out)
    return out.getvalue()


def test_the_command_reports_expired_jobs_and_drains():
    flood = str(TRACES_DIR / "flood.jsonl")
    output = simulate(
        flood, "--gpus", "2", "--policy", "gpusched", "--max-wait", "60", "--callers-leave", "0.2"
    )
    assert "callers: 100% of jobs bound their wait to 60 s; 20% of the top band's" in output
    header = next(line for line in output.splitlines() if line.startswith("| policy"))
    assert "expired" in header and "callers left / drained" in header
    with pytest.raises(CommandError, match="bounded-share must be between 0 and 1"):
        simulate(flood, "--max-wait", "60", "--bounded-share", "2")
