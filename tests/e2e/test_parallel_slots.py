"""Parallel slots as real processes: the simulator as a batching server
(chat parallel 4), the dispatcher cluster, the web server's front door.
Every claim about what overlapped is read from the simulator's own log."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from gpusched.stack import wait_for
from queueapp import services
from queueapp.models import DispatchDecision, Job, JobStatus
from tests import factories
from tests.e2e.helpers import World, all_ended, client_for, streamed_text

pytestmark = [pytest.mark.e2e]


def answered(world: World) -> list[dict]:
    return [entry for entry in world.simulator.log() if entry["status"] == 200]


def most_at_once(entries: list[dict]) -> int:
    """The most requests the simulator had in flight at one instant."""
    edges = sorted(
        [(entry["started_at"], 1) for entry in entries]
        + [(entry["finished_at"], -1) for entry in entries]
    )
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def assert_no_two_models_overlap(entries: list[dict]) -> None:
    for first in entries:
        for second in entries:
            if first["model"] != second["model"]:
                apart = (
                    first["finished_at"] <= second["started_at"]
                    or second["finished_at"] <= first["started_at"]
                )
                assert apart, (first, second)


def test_four_chats_overlap_at_the_simulator_and_models_never_do(batching):
    services.model_parallel_set(name="chat", parallel=4)
    members = [factories.member(f"m{i}", "pro")[0] for i in range(4)]
    # Held until all are queued, so the dispatcher meets a queue, not a trickle.
    services.policy_update(changes={"dispatch_paused": True})
    chats = [
        factories.job(members[i % 4], model="chat", seconds=0.6, label=f"chat-{i}")
        for i in range(8)
    ]
    image = factories.job(members[0], model="image", seconds=0.2, label="image")
    more = [factories.job(members[i], model="chat", seconds=0.6, label=f"late-{i}") for i in (1, 2)]
    batching.start_cluster()
    services.policy_update(changes={"dispatch_paused": False})
    jobs = [*chats, image, *more]
    wait_for(lambda: all_ended(jobs), timeout=60, message="every job to end")

    assert Job.objects.filter(pk__in=[j.pk for j in jobs], status=JobStatus.SUCCEEDED).count() == 11
    log = answered(batching)
    assert sorted(entry["body"]["user"] for entry in log) == sorted(
        job.body["user"] for job in jobs
    )
    assert most_at_once([e for e in log if e["model"] == "chat"]) == 4
    assert max(entry["in_flight"] for entry in log) == 4
    assert_no_two_models_overlap(log)
    slots = set(
        DispatchDecision.objects.filter(job__model="chat").values_list("gpu_slot", flat=True)
    )
    assert slots == {0, 1, 2, 3}


def test_a_waiting_interactive_image_stops_new_chat_slots_and_starts_when_they_end(batching):
    services.model_parallel_set(name="chat", parallel=4)
    members = [factories.member(f"m{i}", "pro")[0] for i in range(3)]
    batching.start_cluster()
    first = [factories.job(members[i], model="chat", seconds=1.5, label=f"c{i}") for i in (0, 1)]
    wait_for(
        lambda: Job.objects.filter(pk__in=[j.pk for j in first], status="running").count() == 2,
        message="two chats to run side by side",
    )
    image = factories.job(members[2], model="image", seconds=0.1, priority="interactive")
    # Chats that arrive after it: slots are free, but the image waits for them.
    later = [factories.job(members[i], model="chat", seconds=0.1, label=f"l{i}") for i in (0, 1)]
    wait_for(lambda: all_ended([*first, image, *later]), timeout=60, message="every job to end")

    image.refresh_from_db()
    started_after_image = Job.objects.filter(
        model="chat", started_at__gt=image.submitted_at, started_at__lt=image.started_at
    )
    assert not started_after_image.exists(), "a chat slot was granted while the image waited"
    longest_end = max(Job.objects.get(pk=job.pk).finished_at for job in first)
    # The dispatcher's reaction to the first chats' submission: the bound
    # below adds five of these, so that it stretches with the machine's load.
    reaction = max(
        (job.started_at - job.submitted_at).total_seconds()
        for job in Job.objects.filter(pk__in=[j.pk for j in first])
    )
    # It starts once the chats in flight end (the dispatcher's reaction, no poll).
    assert (image.started_at - longest_end).total_seconds() < 1.0 + 5 * reaction
    log = answered(batching)
    assert_no_two_models_overlap(log)
    image_entry = next(entry for entry in log if entry["model"] == "image")
    assert image_entry["swapped"] and image_entry["in_flight"] == 1


def test_streaming_front_door_calls_share_the_gpu(batching):
    services.model_parallel_set(name="chat", parallel=4)
    batching.start_cluster()
    web = batching.start_web()
    tokens = [factories.member(f"caller{i}", "pro")[1] for i in range(4)]

    def call(token: str) -> tuple[str, str]:
        raw = client_for(web, token).chat.completions.with_raw_response.create(
            model="chat",
            messages=[{"role": "user", "content": "tell me a story"}],
            stream=True,
            extra_body={"sim": {"seconds": 1.0}},
        )
        text = "".join(
            (chunk.choices[0].delta.content or "") if chunk.choices else "" for chunk in raw.parse()
        )
        return raw.headers["x-gpusched-job-id"], text

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(call, tokens))

    log = answered(batching)
    assert len(log) == 4 and most_at_once(log) >= 2
    # Each caller got the whole stream the simulator sent for its request.
    sent = {streamed_text(batching.simulator.sent(e["seq"])["body"]) for e in log}
    assert {text for _, text in results} == sent and "" not in sent
    assert len({job_id for job_id, _ in results}) == 4
    wait_for(
        lambda: Job.objects.filter(status=JobStatus.SUCCEEDED).count() == 4,
        message="the four calls' ends to be written",
    )


def test_jobs_in_slots_keep_their_leases_while_they_run(batching):
    """Runs several times longer than the lease, past the pass's recovery of
    expired leases (every 5 s): one thread renews every slot's lease, so
    none is taken for a dead dispatcher's and re-queued."""
    services.model_parallel_set(name="chat", parallel=4)
    factories.policy(lease_seconds=1.0)
    members = [factories.member(f"m{i}", "pro")[0] for i in range(3)]
    batching.start_cluster()
    jobs = [factories.job(member, model="chat", seconds=6.0) for member in members]
    wait_for(lambda: all_ended(jobs), timeout=60, message="the three chats to end")

    ended = Job.objects.filter(pk__in=[job.pk for job in jobs])
    assert [(job.status, job.attempts) for job in ended] == [(JobStatus.SUCCEEDED, 1)] * 3
    log = answered(batching)
    assert len(log) == 3 and most_at_once(log) == 3
