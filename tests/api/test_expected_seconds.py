"""`expected_seconds` of a job's API answer: its run's p50 and p90 and what
they rest on (size, model, operator, unknown), set at submission; a body
whose size fields are garbage falls back, and the caller sees no error."""

import pytest

from queueapp.frontdoor.waiting import QueuedStatus
from queueapp.models import ModelSetting
from queueapp.services.run_stats import run_stats_record
from tests import factories

pytestmark = pytest.mark.django_db

CHAT = "/v1/chat/completions"


def submitted(api, token: str, body: dict) -> dict:
    answer = factories.submit(api, token, body=body)
    assert answer.status_code == 201, answer.json()
    return answer.json()["expected_seconds"]


def chat(max_tokens) -> dict:
    return {**factories.chat_body("writer"), "max_tokens": max_tokens}


def test_before_any_run_the_estimate_is_unknown_then_the_operators(api, default_tiers):
    _, token = factories.member("ann", "pro")
    assert submitted(api, token, chat(500)) == {
        "p50": None,
        "p90": None,
        "size": pytest.approx(500 + 2 / 4 / 20),  # max tokens, and "hi" as prefill
        "basis": "unknown",
    }
    ModelSetting.objects.create(name="writer", typical_seconds=30)
    operator = submitted(api, token, chat(500))
    assert (operator["basis"], operator["p50"]) == ("operator", 30)
    assert operator["p90"] > 30


def test_learned_runs_by_size_give_each_job_its_own_estimate(api, default_tiers):
    _, token = factories.member("ann", "pro")
    for tokens in (100, 1000, 400, 200, 800):
        run_stats_record(model="writer", path=CHAT, seconds=tokens / 10, swapped=False, size=tokens)
    short, long = submitted(api, token, chat(100)), submitted(api, token, chat(1000))
    assert short["basis"] == long["basis"] == "size"
    assert long["p50"] / short["p50"] == pytest.approx(10, rel=0.1)
    unsized = submitted(api, token, factories.chat_body("writer"))
    assert (unsized["basis"], unsized["size"]) == ("model", None)


@pytest.mark.parametrize(
    "garbage",
    [{"max_tokens": "lots"}, {"max_tokens": -5}, {"max_tokens": 1e308}, {"max_tokens": True}],
    ids=repr,
)
def test_a_body_with_garbage_size_fields_falls_back_to_the_mean(api, default_tiers, garbage):
    _, token = factories.member("ann", "pro")
    run_stats_record(model="writer", path=CHAT, seconds=12.0, swapped=False, size=None)
    expected = submitted(api, token, {**factories.chat_body("writer"), **garbage})
    if expected["size"] is None:
        assert (expected["basis"], expected["p50"]) == ("model", 12.0)
    else:  # clamped to the range a size may have: still an estimate, never an error
        assert expected["basis"] == "model" and expected["size"] <= 1e12


def test_a_start_after_a_run_of_which_nothing_is_known_is_labelled_a_guess(api, default_tiers):
    _, ann = factories.member("ann", "pro")
    _, bob = factories.member("bob", "pro")
    first = factories.submit(api, ann, body=factories.chat_body("mystery")).json()
    behind = factories.submit(api, bob, body=factories.chat_body("mystery")).json()
    assert first["estimate"]["basis"] == "learned"  # nothing runs before it
    assert behind["estimate"]["basis"] == "guess"
    assert behind["estimate"]["note"].startswith("a guess: a job that runs first")
    queue = api.as_member(bob).get("/api/queue/").json()
    assert [entry["estimate_is_guess"] for entry in queue["queued"]] == [False, True]

    ModelSetting.objects.create(name="mystery", typical_seconds=20)
    again = api.as_member(bob).get(f"/api/jobs/{behind['id']}/").json()
    assert again["estimate"]["basis"] == "learned"
    assert again["estimate"]["seconds_until_start"] == pytest.approx(20, abs=2)


def test_a_waiting_callers_line_says_when_its_start_is_a_guess():
    status = QueuedStatus(position=2, starts_in=41.6, horizon=300, paused=False, holders=())
    assert status.text() == "queued, position 2, estimated start in 42 s; nothing runs now"
    guessed = QueuedStatus(
        position=2, starts_in=41.6, horizon=300, paused=False, holders=(), guess=True
    )
    assert "estimated start in 42 s (a guess: a job ahead has no estimate yet)" in guessed.text()
