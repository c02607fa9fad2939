"""The wait cut once, on several GPUs: the parts add up to the measured
wait and lie inside it, a job never names itself as what held it, its own
earlier attempt is a part of its own, and the member's own other line is
told as theirs, not as another member's turn.

Histories are written as rows at chosen seconds (tests/why/timeline.py), so
every part's length is known."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from queueapp.models import GpuIdle, Job, Tier
from queueapp.why import job_why
from tests import factories
from tests.why.timeline import (
    NOTHING_SKIPPED,
    Timeline,
    assert_the_answer_adds_up,
    capped,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def two_gpus(default_tiers) -> Timeline:
    Tier.objects.filter(name="free").update(max_running_jobs=1, strict_running_limit=True)
    return Timeline("gpu0", "gpu1")


def why(api, token: str, job: Job) -> dict[str, Any]:
    response = api.as_member(token).get(f"/api/jobs/{job.pk}/why/")
    assert response.status_code == 200, response.content
    return response.json()


def kinds(answer: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [part for part in answer["parts"] if part["kind"] == kind]


def test_a_wait_of_three_hundredths_is_told_as_three_hundredths(api, two_gpus):
    """A kept idle record later on the GPU once opened a gap from the wait's
    start to that record's start: 0.03 s told as 20 s of the running limit."""
    ann, token = factories.member("ann", "free")
    bob, _ = factories.member("bob", "free")
    elsewhere = two_gpus.submitted(ann, -10, model="video")
    two_gpus.ran(elsewhere, 0, 100, gpu="gpu1", skips=NOTHING_SKIPPED)
    waiting = two_gpus.submitted(ann, 50)
    two_gpus.ran(waiting, 50.03, 60, gpu="gpu0", skips=NOTHING_SKIPPED)
    later = two_gpus.submitted(bob, 65)
    two_gpus.ran(
        later,
        90,
        95,
        gpu="gpu0",
        skips=NOTHING_SKIPPED,
        idle_reason={
            "since": two_gpus.at(70).isoformat(),
            "skips": capped(ann, (elsewhere, "gpu1")),
        },
    )

    answer = why(api, token, waiting)

    assert answer["measured_wait_seconds"] == 0.03
    assert_the_answer_adds_up(answer)
    assert "while your own job ran elsewhere" not in answer["summary"]


def test_a_job_cut_by_an_unload_tells_its_own_earlier_attempt_and_never_names_itself(api, two_gpus):
    """Its first run on gpu1 was cut at 30 s; the idle gpu0's kept record,
    written while it ran there, names it as what held the running limit."""
    ann, token = factories.member("ann", "free")
    job = two_gpus.submitted(ann, 0)
    two_gpus.returned(job, 10, 30, gpu="gpu1")
    two_gpus.ran(
        job,
        40,
        50,
        gpu="gpu0",
        skips=NOTHING_SKIPPED,
        idle_reason={"since": two_gpus.at(0).isoformat(), "skips": capped(ann, (job, "gpu1"))},
    )

    answer = why(api, token, job)

    assert_the_answer_adds_up(answer)
    (own,) = kinds(answer, "own_earlier_attempt")
    assert own["seconds"] == 20.0
    assert own["reason"] == (
        "your own earlier attempt on gpu1, cut by an unload; the job went back to the queue"
    )
    assert not kinds(answer, "running_limit")
    assert kinds(answer, "gpu_idle")[0]["seconds"] == 20.0
    assert "your own earlier attempt" in answer["summary"]


def test_the_running_limit_names_only_the_jobs_that_ran_in_its_stretch(api, two_gpus):
    """The kept record names two holders; one had ended before the wait."""
    ann, token = factories.member("ann", "free")
    ended = two_gpus.submitted(ann, -20, model="video")
    two_gpus.ran(ended, -15, -5, gpu="gpu1", skips=NOTHING_SKIPPED)
    running = two_gpus.submitted(ann, -4, model="video")
    two_gpus.ran(running, -3, 12, gpu="gpu1", skips=NOTHING_SKIPPED)
    waiting = two_gpus.submitted(ann, 0)
    record = capped(ann, (ended, "gpu1"), (running, "gpu1"))
    two_gpus.ran(
        waiting,
        20,
        25,
        gpu="gpu0",
        skips=NOTHING_SKIPPED,
        idle_reason={"since": two_gpus.at(-10).isoformat(), "skips": record},
    )

    answer = why(api, token, waiting)

    assert_the_answer_adds_up(answer)
    (held,) = kinds(answer, "running_limit")
    assert held["seconds"] == 12.0
    assert held["held_by"] == [{"id": running.pk, "gpu": "gpu1"}]
    assert kinds(answer, "gpu_idle")[0]["seconds"] == 8.0


def test_the_members_own_other_line_is_told_as_their_own_turn(api, two_gpus):
    """Ann's chat went before her embedding, same band: her own chat line's
    turn, never "its member's turn"."""
    ann, token = factories.member("ann", "free")
    embedding = two_gpus.submitted(ann, 0, model="embed-small")
    earlier_chat = two_gpus.submitted(ann, -10, model="chat-small")
    two_gpus.ran(earlier_chat, 0, 5, swap=True)
    chat = two_gpus.submitted(ann, 1, model="chat-small")
    # Its terms as the claim kept them: the embedding would have won had
    # ann's own earlier chat not reset its clock (the fairness term).
    terms = {"band": 0, "tier_bonus": 0, "swap_affinity": 0.0, "aging": 4 / 60, "effective": 4 / 60}
    two_gpus.ran(chat, 5, 9, swap=True, terms=terms)
    two_gpus.ran(embedding, 9, 10, swap=True)

    answer = why(api, token, embedding)

    assert_the_answer_adds_up(answer)
    turns = [part for part in kinds(answer, "dispatched_ahead") if part["job"]["id"] == chat.pk]
    assert turns[0]["deciding_term"] == "your other line"
    assert turns[0]["reason"] == "your own chat-small job took its turn"
    assert "its member's turn" not in str(answer)
    assert "your own chat-small job took its turn" in answer["summary"]


def test_another_members_turn_is_still_told_as_theirs(api, two_gpus):
    ann, token = factories.member("ann", "free")
    bob, _ = factories.member("bob", "free")
    embedding = two_gpus.submitted(ann, 0, model="embed-small")
    earlier = two_gpus.submitted(ann, -10, model="chat-small")
    two_gpus.ran(earlier, 2, 5, swap=True)  # resets ann's clock in band 0
    chat = two_gpus.submitted(bob, 1, model="chat-small")
    terms = {"band": 0, "tier_bonus": 0, "swap_affinity": 0.0, "aging": 4 / 60, "effective": 4 / 60}
    two_gpus.ran(chat, 5, 9, swap=True, terms=terms)
    two_gpus.ran(embedding, 9, 10, swap=True)

    answer = why(api, token, embedding)

    (turn,) = [p for p in kinds(answer, "dispatched_ahead") if p["job"]["id"] == chat.pk]
    assert turn["deciding_term"] == "fairness"
    assert turn["reason"] == "its member's turn (your own jobs had just run)"


def test_a_queued_job_cut_earlier_is_told_up_to_now_and_adds_up(api, two_gpus):
    ann, token = factories.member("ann", "free")
    job = two_gpus.submitted(ann, 0)
    two_gpus.returned(job, 2, 5, gpu="gpu0")
    GpuIdle.objects.create(
        gpu=two_gpus.gpu, since=two_gpus.at(5), at=two_gpus.at(6), skips=NOTHING_SKIPPED
    )

    answer = why(api, token, job)

    assert answer["still_waiting"]
    assert_the_answer_adds_up(answer)
    (own,) = kinds(answer, "own_earlier_attempt")
    assert own["seconds"] == 3.0


def test_shown_tenths_add_up_to_the_shown_wait(api, two_gpus):
    """1.04 s behind a job and 2.08 s idle, shown as tenths: 1.0 + 2.1 = 3.1."""
    ann, token = factories.member("ann", "free")
    bob, _ = factories.member("bob", "free")
    waiting = two_gpus.submitted(ann, 0, priority="batch")
    ahead = two_gpus.submitted(bob, 0.5)
    two_gpus.ran(ahead, 1.04, 2.08)
    two_gpus.ran(waiting, 3.12, 4)

    answer = why(api, token, waiting)

    assert answer["measured_wait_seconds"] == 3.12
    assert answer["shown_wait_seconds"] == 3.1
    assert sorted(part["shown_seconds"] for part in answer["parts"]) == [1.0, 2.1]
    assert_the_answer_adds_up(answer)


@pytest.mark.parametrize("gpus", [1, 2])
def test_the_queries_do_not_grow_with_the_jobs_ahead(default_tiers, gpus):
    """Each decision and job is read in the same few statements, however
    many there are: a field `why` reads that its queries leave out
    (queueapp/why/attempts.py, READ_DECISION_FIELDS) would cost one per row."""
    timeline = Timeline(*[f"gpu{index}" for index in range(gpus)])
    ann, _ = factories.member("ann", "free")
    bob, _ = factories.member("bob", "free")
    staff, _ = factories.member("ops", "free", staff=True)  # sees every field

    def queries_behind(count: int, start: float) -> int:
        waiting = timeline.submitted(ann, start, priority="batch")
        for index in range(count):
            ahead = timeline.submitted(bob, start + 0.1)
            second = start + 1 + 2 * index
            gpu = f"gpu{index % gpus}"
            timeline.ran(ahead, second, second + 1, gpu=gpu, skips=NOTHING_SKIPPED)
        timeline.ran(waiting, start + 1 + 2 * count, start + 2 + 2 * count)
        job = Job.objects.select_related("member__tier").get(pk=waiting.pk)
        with CaptureQueriesContext(connection) as queries:
            answer = job_why(job=job, viewer=staff)
        assert len(answer["parts"]) >= count // gpus
        return len(queries)

    queries_behind(2, 0)  # a history before, as the next two have
    assert queries_behind(3, 100) == queries_behind(12, 200)


def test_an_attempt_whose_end_was_not_recorded_runs_to_its_next_dispatch(api, two_gpus):
    """Bob's job was dispatched at 2 s and again at 6 s, with no event
    ending the first: it is counted to 6 s, not to now, and says so."""
    ann, token = factories.member("ann", "free")
    bob, _ = factories.member("bob", "free")
    waiting = two_gpus.submitted(ann, 0, priority="batch")
    ahead = two_gpus.submitted(bob, 1)
    two_gpus.decided(ahead, 2)
    two_gpus.ran(ahead, 6, 8)
    two_gpus.ran(waiting, 8, 9)

    answer = why(api, token, waiting)

    assert_the_answer_adds_up(answer)
    first, second = [p for p in kinds(answer, "dispatched_ahead") if p["job"]["id"] == ahead.pk]
    assert (first["seconds"] + first["swap_seconds"], first["end_recorded"]) == (4.0, False)
    assert second["seconds"] + second["swap_seconds"] == 2.0 and "end_recorded" not in second
