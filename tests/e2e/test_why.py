"""'Why did my job wait?' against real dispatches: terms, counters, privacy.

The cases share one running system (conftest.py's `running`), each with
rows of its own."""

import pytest

from gpusched.stack import wait_for
from queueapp.models import DispatchDecision, Job, JobStatus
from queueapp.selectors import db_now
from tests import factories
from tests.e2e.helpers import make_resident, release_and_wait

pytestmark = [pytest.mark.e2e]


def why(api, token, job):
    response = api.as_member(token).get(f"/api/jobs/{job.pk}/why/")
    assert response.status_code == 200, response.content
    return response.json()


def assert_parts_add_up(answer):
    assert answer["parts_total_seconds"] == pytest.approx(answer["measured_wait_seconds"], abs=1.0)
    started = Job.objects.get(pk=answer["job"])
    measured = (started.started_at - started.submitted_at).total_seconds()
    assert answer["measured_wait_seconds"] == pytest.approx(measured, abs=0.01)
    # Each job ahead counts for exactly the part of its run inside the wait.
    for part in answer["parts"]:
        if part["kind"] == "dispatched_ahead":
            ahead = Job.objects.get(pk=part["job"]["id"])
            inside = min(ahead.finished_at, started.started_at) - max(
                ahead.started_at, started.submitted_at
            )
            assert part["seconds"] + part["swap_seconds"] == pytest.approx(
                inside.total_seconds(), abs=0.01
            ), part


def ahead_of(answer, job):
    return next(
        p for p in answer["parts"] if p["kind"] == "dispatched_ahead" and p["job"]["id"] == job.pk
    )


def test_tier_changes_the_order_and_the_why_says_so(running, api):
    free, free_token = factories.member("fay", "free")
    pro, _ = factories.member("pat-promember", "pro")
    factories.policy(dispatch_paused=True)
    waiting = factories.job(
        free, priority="batch", model="chat-a", label="free", prompt="secret-free"
    )
    winner = factories.job(pro, priority="batch", model="chat-a", label="pro")
    Job.objects.filter(pk=winner.pk).update(body={**winner.body, "note": "secret-pro"})
    assert release_and_wait(running, 2) == ["pro", "free"]
    decision = DispatchDecision.objects.get(job=winner)
    assert (
        decision.changed_by_tier_bonus
        and decision.counterfactuals["tier_bonus"]["winner"] == waiting.pk
    )
    assert not decision.changed_by_swap_affinity and not decision.changed_by_aging

    answer = why(api, free_token, waiting)
    assert_parts_add_up(answer)
    part = ahead_of(answer, winner)
    assert part["deciding_term"] == "tier_bonus"
    assert (part["their_terms"]["tier_bonus"], part["your_terms"]["tier_bonus"]) == (1, 0)
    assert "higher tier" in answer["summary"]
    # Another member's name and body never reach a non-staff caller.
    assert "pat-promember" not in str(answer) and "secret-pro" not in str(answer)
    assert part["job"]["member"] is None

    _, staff_token = factories.member("ops", "max", staff=True)
    assert ahead_of(why(api, staff_token, waiting), winner)["job"]["member"] == "pat-promember"

    stats = api.as_member(free_token).get("/api/stats/?window=hour").json()
    batch = next(band for band in stats["bands"] if band["band"] == -100)
    assert batch["dispatched"] == 2
    assert batch["order_changed_by"]["tier_bonus"] == 1


def test_swap_affinity_changes_the_order_and_the_why_says_so(running, api):
    first, first_token = factories.member("ann", "free")
    second, _ = factories.member("bob", "free")
    make_resident(running, second, "chat-a")
    factories.policy(dispatch_paused=True)
    other_model = factories.job(first, model="chat-b", label="b-older")
    loaded_model = factories.job(second, model="chat-a", label="a-loaded")
    assert release_and_wait(running, 2) == ["a-loaded", "b-older"]
    decision = DispatchDecision.objects.get(job=loaded_model)
    assert decision.changed_by_swap_affinity
    assert not decision.changed_by_tier_bonus
    answer = why(api, first_token, other_model)
    assert_parts_add_up(answer)
    assert ahead_of(answer, loaded_model)["deciding_term"] == "swap_affinity"
    assert "already loaded" in answer["summary"]


def test_aging_changes_the_order_and_the_why_says_so(running, api):
    factories.policy(aging_divisor=0.01, dispatch_paused=True)
    patient, _ = factories.member("max-member", "max")
    hurried, hurried_token = factories.member("free-member", "free")
    old = factories.job(patient, priority="batch", model="chat-a", label="old-batch")
    wait_for(
        lambda: (db_now() - old.submitted_at).total_seconds() > 2.3,
        message="the batch job to wait longer than the band gap",
    )
    fresh = factories.job(hurried, priority="interactive", model="chat-a", label="interactive")
    assert release_and_wait(running, 2) == ["old-batch", "interactive"]
    decision = DispatchDecision.objects.get(job=old)
    assert decision.changed_by_aging and decision.counterfactuals["aging"]["winner"] == fresh.pk
    answer = why(api, hurried_token, fresh)
    assert_parts_add_up(answer)
    assert ahead_of(answer, old)["deciding_term"] == "aging"
    assert answer["summary"].startswith("Waited ")


def test_the_running_job_is_its_own_part_and_idle_time_is_counted(running, api):
    member, token = factories.member("ann", "pro")
    render = factories.job(member, priority="batch", model="chat-a", seconds=1.0, label="render")
    wait_for(
        lambda: Job.objects.get(pk=render.pk).status == JobStatus.RUNNING,
        message="the render to start",
    )
    quick = factories.job(member, priority="interactive", model="chat-a", label="quick")
    wait_for(
        lambda: Job.objects.get(pk=quick.pk).status == JobStatus.SUCCEEDED,
        message="the quick job to run",
    )
    answer = why(api, token, quick)
    assert_parts_add_up(answer)
    kinds = [part["kind"] for part in answer["parts"]]
    assert kinds[0] == "running_when_submitted"
    assert answer["parts"][0]["job"]["id"] == render.pk
    assert "never interrupted" in answer["summary"]


def test_fairness_changes_the_order_and_the_why_says_so(running, api):
    busy, busy_token = factories.member("bea-busy", "free")
    other, other_token = factories.member("oz-other", "free")
    factories.policy(dispatch_paused=True)
    first = factories.job(busy, priority="batch", model="chat-a", label="busy-1")
    second = factories.job(busy, priority="batch", model="chat-a", label="busy-2")
    # Submitted last: without the lane clock, both of bea's jobs go first.
    turn = factories.job(other, priority="batch", model="chat-a", label="other-1")
    assert release_and_wait(running, 3) == ["busy-1", "other-1", "busy-2"]
    decision = DispatchDecision.objects.get(job=turn)
    assert decision.changed_by_fairness
    assert decision.counterfactuals["fairness"]["winner"] == second.pk
    # The lane clock works through aging: without either, bea's older job wins.
    assert decision.changed_by_aging
    assert not (decision.changed_by_tier_bonus or decision.changed_by_swap_affinity)

    answer = why(api, busy_token, second)
    assert_parts_add_up(answer)
    assert ahead_of(answer, first)["deciding_term"] == "your earlier job"
    part = ahead_of(answer, turn)
    assert part["deciding_term"] == "fairness"
    # bea's job had waited longer, but ages only from bea's last dispatch.
    assert part["your_terms"]["waited_seconds"] > part["their_terms"]["waited_seconds"]
    assert part["your_terms"]["aged_seconds"] < part["their_terms"]["aged_seconds"]
    assert "member's turn" in answer["summary"]
    assert "oz-other" not in str(answer) and part["job"]["member"] is None

    for window in ("hour", "day", "all"):
        stats = api.as_member(other_token).get(f"/api/stats/?window={window}").json()
        batch = next(band for band in stats["bands"] if band["band"] == -100)
        assert batch["dispatched"] == 3, window
        assert batch["order_changed_by"] == {
            "aging": 1,
            "swap_affinity": 0,
            "tier_bonus": 0,
            "fairness": 1,
        }, window
