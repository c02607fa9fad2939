"""What llama-swap runs, as the running system sees it: an unload shows in
`GET /api/gpus/` from the events at once and from `/running` re-reads when
events are lost, a job cut by an unload runs again once, and requests that
did not come through gpusched show as foreign load, in the GPU and in a
waiting job's `why`. The simulator speaks llama-swap's events and unload
routes (queueapp/upstream/simulator/events.py)."""

from __future__ import annotations

import time

import httpx
import pytest

from gpusched.stack import wait_for
from queueapp.dispatch.upstream_watch import REREAD_SECONDS
from queueapp.models import DispatchDecision, JobEvent, JobStatus
from tests import factories
from tests.e2e.helpers import ended

pytestmark = [pytest.mark.e2e]


def gpu0(api, token: str) -> dict:
    (gpu,) = api.as_member(token).get("/api/gpus/").json()
    return gpu


def warm(world, api, model: str = "chat-a") -> tuple[object, str]:
    """The stack started, `model` loaded by a job, and the GPU showing it."""
    world.start_cluster()
    member, token = factories.member("ann", "pro")
    first = factories.job(member, model=model, seconds=0.05)
    assert ended(first.pk).status == JobStatus.SUCCEEDED
    wait_for(lambda: gpu0(api, token)["resident_models"] == [model], message="chat-a resident")
    return member, token


def unload(world, model: str) -> None:
    answer = httpx.post(f"{world.simulator.url}/api/models/unload/{model}", timeout=10)
    assert answer.status_code == 200, answer.text


def test_an_unload_shows_at_once_and_the_next_job_is_scored_without_affinity(world, api):
    member, token = warm(world, api)
    assert gpu0(api, token)["resident_model"] == "chat-a"

    unload(world, "chat-a")
    # The events bring it: well inside the re-read interval.
    wait_for(
        lambda: gpu0(api, token)["resident_models"] == [],
        timeout=1.0,
        message="the unload in GET /api/gpus/ within 1 s",
    )
    assert gpu0(api, token)["resident_model"] is None
    job = factories.job(member, model="chat-a", seconds=0.05)
    assert ended(job.pk).status == JobStatus.SUCCEEDED
    decision = DispatchDecision.objects.get(job=job)
    assert decision.swap_needed is True
    assert decision.terms["swap_affinity"] == 0


def test_with_events_lost_an_unload_shows_within_the_reread_interval(world, api):
    _, token = warm(world, api)
    switched = httpx.post(f"{world.simulator.url}/sim/events", json={"enabled": False}, timeout=5)
    assert switched.status_code == 200, switched.text

    start = time.monotonic()
    unload(world, "chat-a")
    wait_for(
        lambda: gpu0(api, token)["resident_models"] == [],
        timeout=REREAD_SECONDS + 2.0,
        message="the unload seen by the /running re-read",
    )
    # Not from events (there were none): no sooner than the re-read could.
    assert world.simulator.events_enabled is False
    assert time.monotonic() - start <= REREAD_SECONDS + 2.0


def test_a_job_cut_by_an_unload_runs_again_once_and_succeeds(world, api):
    member, token = warm(world, api)
    job = factories.job(member, model="chat-a", seconds=3, label="cut")
    wait_for(lambda: runs_of(world, "cut"), message="the job running at the simulator")
    unload(world, "chat-a")

    assert ended(job.pk).status == JobStatus.SUCCEEDED
    (cut,) = JobEvent.objects.filter(job=job, detail__cut_by_unload=True)
    assert cut.kind == JobEvent.Kind.RETURNED_TO_QUEUE
    answer = api.as_member(token).get(f"/api/jobs/{job.pk}/why/").json()
    assert len(answer["cut_by_unload"]) == 1
    assert "llama-swap unloaded chat-a while this job ran" in answer["summary"]
    # Two requests reached the simulator: the cut one and the one that answered.
    assert [e["status"] for e in runs_of(world, "cut")] == [502, 200]


def test_requests_from_elsewhere_show_as_foreign_load_in_the_gpu_and_in_why(world, api):
    member, token = warm(world, api)
    # Another client calls llama-swap directly and holds its one slot.
    with httpx.Client(base_url=world.simulator.url, timeout=30) as other:
        foreign = _in_background(
            lambda: other.post(
                "/v1/chat/completions",
                json={"model": "chat-a", "messages": [], "sim": {"seconds": 4}},
            )
        )
        wait_for(
            lambda: gpu0(api, token)["foreign_in_flight"] == 1,
            timeout=5,
            message="the foreign request counted",
        )
        # Held in the queue while why is asked: foreign load does not stop a
        # dispatch (llama-swap queues the job behind it), and the claim could
        # otherwise come first on a busy machine.
        factories.policy(dispatch_paused=True)
        waiting = factories.job(member, model="chat-a", seconds=0.05)
        answer = api.as_member(token).get(f"/api/jobs/{waiting.pk}/why/").json()
        assert answer["still_waiting"]
        assert answer["foreign_load"] == [
            {
                "gpu": "gpu0",
                "requests": 1,
                "text": "gpu0 is also serving 1 request that did not come through gpusched.",
            }
        ]
        assert answer["foreign_load"][0]["text"] in answer["summary"]
        factories.policy(dispatch_paused=False)
        assert foreign().status_code == 200
    wait_for(lambda: gpu0(api, token)["foreign_in_flight"] == 0, message="the foreign request gone")
    assert ended(waiting.pk).status == JobStatus.SUCCEEDED


def runs_of(world, label: str) -> list[dict]:
    """The simulator's requests of the job labelled `label` that started."""
    return [
        entry
        for entry in world.simulator.log()
        if (entry.get("body") or {}).get("user") == label and entry["started_at"] is not None
    ]


def _in_background(call):
    import threading

    box: dict[str, object] = {}
    thread = threading.Thread(target=lambda: box.setdefault("value", call()), daemon=True)
    thread.start()

    def result():
        thread.join(timeout=30)
        return box["value"]

    return result


def test_a_front_door_call_cut_by_an_unload_runs_again_and_its_caller_gets_the_answer(world, api):
    _, token = warm(world, api)
    web = world.start_web()
    body = {
        "model": "chat-a",
        "messages": [{"role": "user", "content": "hi"}],
        "user": "door",
        "sim": {"seconds": 3},
    }
    call = _in_background(
        lambda: httpx.post(
            f"{web.url}/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {token}"},
            timeout=60,
        )
    )
    wait_for(lambda: runs_of(world, "door"), message="the call running at the simulator")
    unload(world, "chat-a")

    answer = call()
    assert answer.status_code == 200, answer.text
    assert answer.json()["object"] == "chat.completion"
    (cut,) = JobEvent.objects.filter(detail__cut_by_unload=True)
    assert cut.job.front_door
    # The caller is answered first; the job's end is written meanwhile.
    assert ended(cut.job_id).status == JobStatus.SUCCEEDED
    assert [e["status"] for e in runs_of(world, "door")] == [502, 200]
