"""`as_of` on `GET /api/jobs/{id}/why/` and the page `/jobs/{id}/why/`: a
queued job's wait told at one instant instead of now, so that answers asked
at one instant agree; refused (400, naming `as_of`) for a job no longer
queued, or an instant outside its wait so far."""

from __future__ import annotations

import html
from datetime import datetime
from typing import Any

import pytest

from queueapp.models import Job
from tests import factories
from tests.pages.why_page import read_why_page
from tests.why.timeline import Timeline, assert_the_answer_adds_up

pytestmark = pytest.mark.django_db


@pytest.fixture
def history(default_tiers) -> Timeline:
    """The GPU's history, an hour long: its now is second 3600."""
    return Timeline()


def asked(api, token: str, job: Job, as_of: str) -> Any:
    return api.as_member(token).get(f"/api/jobs/{job.pk}/why/", {"as_of": as_of})


def queued_behind_two(history: Timeline) -> tuple[Job, str]:
    """Ann's job, queued since second 0: bob's job ran until 20, another
    from 21 to 25, and a third from 40 to 50."""
    ann, token = factories.member("ann", "free")
    bob, _ = factories.member("bob", "max")
    first, second, third = (
        history.submitted(bob, -5 + n, priority="interactive") for n in range(3)
    )
    history.ran(first, -3, 20)
    history.ran(second, 21, 25)
    history.ran(third, 40, 50)
    return history.submitted(ann, 0, priority="batch"), token


def test_a_queued_job_asked_at_one_instant_gets_one_answer_from_the_api_and_the_page(
    api, client, history
):
    waiting, token = queued_behind_two(history)
    instant = history.at(30).isoformat()

    answer = asked(api, token, waiting, instant).json()
    again = asked(api, token, waiting, instant).json()
    client.post("/login/", {"token": token})
    page = client.get(f"/jobs/{waiting.pk}/why/", {"as_of": instant})

    assert answer == again
    assert answer["as_of"] == instant
    assert answer["measured_wait_seconds"] == 30.0
    assert_the_answer_adds_up(answer)
    # The run from 40 to 50 came after the instant asked for.
    assert [(p["kind"], p["shown_seconds"]) for p in answer["parts"]] == [
        ("running_when_submitted", 20.0),
        ("dispatched_ahead", 4.0),
        ("gpu_idle", 6.0),
    ]
    assert page.status_code == 200
    drawn = read_why_page(page.content.decode())
    told = [(part["kind"], f"{part['shown_seconds']:.1f}") for part in answer["parts"]]
    assert [(kind, cells[1]) for kind, cells in drawn.rows] == told
    assert drawn.total[:2] == ["measured wait", "30.0"]
    assert f"?as_of={instant.replace(':', '%3A').replace('+', '%2B')}" in page.content.decode()


def test_a_plus_that_the_query_string_turned_into_a_space_is_read_back(api, history):
    waiting, token = queued_behind_two(history)
    instant = history.at(30).isoformat()
    answer = asked(api, token, waiting, instant.replace("+", " ")).json()
    assert answer["as_of"] == instant


@pytest.mark.parametrize(
    ("as_of", "problem"),
    [
        (lambda history: "yesterday", "ISO 8601"),
        (lambda history: history.at(30).replace(tzinfo=None).isoformat(), "ISO 8601"),
        (lambda history: history.at(-1).isoformat(), "between the job's submission"),
        (lambda history: history.at(3601).isoformat(), "between the job's submission"),
    ],
    ids=["not-a-time", "no-offset", "before-submission", "after-now"],
)
def test_an_instant_outside_the_wait_so_far_is_refused_naming_as_of(
    api, client, history, as_of, problem
):
    waiting, token = queued_behind_two(history)
    response = asked(api, token, waiting, as_of(history))
    assert response.status_code == 400
    assert response.json()["detail"].startswith("as_of: ")
    assert problem in response.json()["detail"]

    client.post("/login/", {"token": token})
    page = client.get(f"/jobs/{waiting.pk}/why/", {"as_of": as_of(history)})
    assert page.status_code == 400
    text = html.unescape(page.content.decode())
    assert "as_of: " in text and problem in text


@pytest.mark.parametrize("end", [None, 40.0], ids=["running", "finished"])
def test_a_job_no_longer_queued_is_told_at_now_only(api, history, end):
    ann, token = factories.member("ann", "free")
    job = history.submitted(ann, 0)
    history.ran(job, 10, end)

    response = asked(api, token, job, history.at(5).isoformat())

    assert response.status_code == 400
    detail = response.json()["detail"]
    assert detail.startswith("as_of: only for a job still queued"), detail
    assert api.as_member(token).get(f"/api/jobs/{job.pk}/why/").status_code == 200


def test_the_instant_now_itself_is_taken(api, history):
    waiting, token = queued_behind_two(history)
    now = history.at(3600)
    answer = asked(api, token, waiting, now.isoformat()).json()
    assert datetime.fromisoformat(answer["as_of"]) == now
    assert answer["measured_wait_seconds"] == 3600.0
