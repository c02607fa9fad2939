"""Crashes and upstream trouble: nothing lost, never two jobs at once."""

import threading

import httpx
import pytest
from django_q.tasks import async_task

from gpusched.stack import free_port, wait_for
from gpusched.upstreams import dispatch_cluster_name
from queueapp.dispatch.wakeup import DISPATCH_TASK
from queueapp.models import Gpu, Job, JobStatus
from queueapp.upstream.simulator import LlamaSwapSimulator
from tests import factories
from tests.e2e.helpers import Watcher

pytestmark = [pytest.mark.e2e]


def events(job):
    return list(job.events.values_list("kind", flat=True))


def assert_never_overlapping(entries):
    """The simulator never had two of these requests in flight at once."""
    spans = sorted((e["received_at"], e["finished_at"]) for e in entries)
    for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
        assert end is not None and start >= end, spans


def test_heartbeat_keeps_a_job_longer_than_its_lease(world):
    factories.policy(lease_seconds=1.0)
    world.start_cluster()
    member, _ = factories.member("ann", "free")
    long_job = factories.job(member, model="chat-a", seconds=3.5, label="long")
    wait_for(
        lambda: Job.objects.get(pk=long_job.pk).status == JobStatus.SUCCEEDED,
        message="the long job to succeed",
    )
    finished = Job.objects.get(pk=long_job.pk)
    assert finished.attempts == 1
    assert events(finished) == ["submitted", "started", "succeeded"]
    assert len(world.simulator.log()) == 1


LEASE_SECONDS = 1.5


def test_killed_cluster_mid_job_loses_nothing_and_never_runs_a_job_twice_at_once(world):
    factories.policy(lease_seconds=LEASE_SECONDS)
    first = world.start_cluster()
    member, _ = factories.member("ann", "free")
    victim = factories.job(member, model="chat-a", seconds=2.0, label="victim")
    wait_for(
        lambda: any(e["body"]["user"] == "victim" for e in world.simulator.log()),
        message="the job to reach the simulator",
    )
    first.kill()
    # The lease as the dead dispatcher left it: nobody renews it any more.
    dead_lease = Job.objects.get(pk=victim.pk).lease_expires_at.timestamp()
    waiting = factories.job(member, model="chat-a", label="waiting")
    assert Job.objects.get(pk=victim.pk).status == JobStatus.RUNNING

    world.start_cluster()
    wait_for(
        lambda: Job.objects.filter(status=JobStatus.SUCCEEDED).count() == 2,
        message="both jobs to succeed after the restart",
    )
    victim = Job.objects.get(pk=victim.pk)
    assert victim.attempts == 2
    assert events(victim) == ["submitted", "started", "requeued", "started", "succeeded"]
    victim_entries = [e for e in world.simulator.log() if e["body"]["user"] == "victim"]
    assert_never_overlapping(victim_entries)
    # The simulator ends a request when its client hangs up, so the check
    # above holds whenever the re-run comes. What keeps a re-run from
    # overlapping a request still in flight (a dispatcher cut off, not dead):
    # the job is re-queued only once the lease its heartbeat renewed expired,
    # and re-run only after that. (Simulator and database times come from
    # this machine's one clock.)
    assert [e["status"] for e in victim_entries] == [499, 200], victim_entries
    killed, rerun = victim_entries
    requeued = victim.events.get(kind="requeued").at.timestamp()
    origin = killed["received_at"]
    figures = (
        f"seconds after the first attempt reached the simulator: it ended there at "
        f"{killed['finished_at'] - origin:.3f}, its lease ({LEASE_SECONDS} s, renewed while it "
        f"ran) expired at {dead_lease - origin:.3f}, the job was re-queued at "
        f"{requeued - origin:.3f} and the re-run reached the simulator at "
        f"{rerun['received_at'] - origin:.3f}"
    )
    assert killed["finished_at"] <= rerun["received_at"], figures
    assert dead_lease <= requeued < rerun["received_at"], figures
    # Re-queued at its original place: ahead of the job submitted after it.
    assert [e["body"]["user"] for e in world.served()][-2:] == ["victim", "waiting"]
    assert Job.objects.get(pk=waiting.pk).attempts == 1


def test_a_job_lost_too_often_fails_with_a_clear_error(world):
    factories.policy(lease_seconds=1.0, max_attempts=1)
    first = world.start_cluster()
    member, _ = factories.member("ann", "free")
    victim = factories.job(member, model="chat-a", seconds=2.0, label="victim")
    wait_for(lambda: world.simulator.log(), message="the job to reach the simulator")
    first.kill()
    world.start_cluster()
    wait_for(
        lambda: Job.objects.get(pk=victim.pk).status == JobStatus.FAILED,
        message="the job to fail",
    )
    assert "max_attempts is 1" in Job.objects.get(pk=victim.pk).error


def test_unreachable_upstream_keeps_jobs_queued_until_it_returns(world):
    port = free_port()
    world.start_cluster(upstream_url=f"http://127.0.0.1:{port}")
    member, _ = factories.member("ann", "free")
    job = factories.job(member, model="chat-a", label="patient")
    wait_for(
        lambda: Gpu.objects.filter(name="gpu0", reachable=False).exists(),
        message="the dispatcher to notice llama-swap is down",
    )
    assert Job.objects.get(pk=job.pk).status == JobStatus.QUEUED
    late = LlamaSwapSimulator(port=port, models={"chat-a": 0.05}, swap_seconds=0.1).start()
    try:
        wait_for(
            lambda: Job.objects.get(pk=job.pk).status == JobStatus.SUCCEEDED,
            message="the job to run once llama-swap is back",
        )
        assert [e["status"] for e in late.log()] == [200]
    finally:
        late.stop()
    assert Job.objects.get(pk=job.pk).attempts == 1


def test_llama_swap_busy_with_another_client_returns_the_job_to_the_queue(world):
    world.start_cluster()
    member, _ = factories.member("ann", "free")
    other_client = threading.Thread(
        target=lambda: httpx.post(
            f"{world.simulator.url}/v1/chat/completions",
            json={"model": "chat-a", "user": "someone-else", "sim": {"seconds": 1.5}},
            timeout=10,
        )
    )
    other_client.start()
    wait_for(lambda: world.simulator.log(), message="the other client to occupy llama-swap")
    job = factories.job(member, model="chat-a", label="ours")
    wait_for(
        lambda: Job.objects.get(pk=job.pk).status == JobStatus.SUCCEEDED,
        message="our job to succeed after the other client",
    )
    other_client.join()
    job = Job.objects.get(pk=job.pk)
    assert "returned_to_queue" in events(job)
    assert job.attempts == 1
    statuses = [e["status"] for e in world.simulator.log() if e["body"]["user"] == "ours"]
    assert statuses[0] == 429 and statuses[-1] == 200


def test_duplicate_dispatch_tasks_and_a_second_cluster_never_start_two_jobs(world):
    world.start_cluster()
    world.start_cluster()
    member, _ = factories.member("ann", "free")
    factories.policy(dispatch_paused=True)
    for index in range(6):
        factories.job(member, model="chat-a", seconds=0.2, label=f"job-{index}")
    factories.policy(dispatch_paused=False)
    for _ in range(6):  # as if the broker re-delivered the task several times
        async_task(DISPATCH_TASK, cluster=dispatch_cluster_name("gpu0"))
    wait_for(
        lambda: Job.objects.filter(status=JobStatus.SUCCEEDED).count() == 6,
        message="all six jobs to succeed",
    )
    log = world.simulator.log()
    assert [e["status"] for e in log] == [200] * 6  # a 429 would mean two at once
    assert_never_overlapping(log)
    assert sorted(Job.objects.values_list("attempts", flat=True)) == [1] * 6


def test_llama_swap_stopped_for_a_while_fails_nothing_and_health_and_dashboard_say_so(world):
    port = free_port()
    upstream = LlamaSwapSimulator(port=port, models={"chat-a": 0.05}, swap_seconds=0.1).start()
    world.start_cluster(upstream_url=upstream.url)
    web = world.start_web(LLAMA_SWAP_URL=upstream.url)
    member, token = factories.member("ann", "free")
    before = factories.job(member, model="chat-a", label="before")
    wait_for(
        lambda: Job.objects.get(pk=before.pk).status == JobStatus.SUCCEEDED,
        message="a job to succeed while llama-swap is up",
    )

    upstream.stop()
    waiting = [factories.job(member, model="chat-a", label=f"waiting-{i}") for i in range(3)]
    health = wait_for(
        lambda: (
            (answer := httpx.get(f"{web.url}/api/health/").json())["status"] == "degraded"
            and answer
        ),
        message="the health endpoint to report llama-swap down",
    )
    assert health["upstream"]["reachable"] is False and health["upstream"]["error"]
    with Watcher(web.url, token) as dashboard:
        assert dashboard.state["upstream"]["reachable"] is False
        assert {entry["id"] for entry in dashboard.state["queued"]} == {j.pk for j in waiting}
    assert all(Job.objects.get(pk=j.pk).status == JobStatus.QUEUED for j in waiting)

    back = LlamaSwapSimulator(port=port, models={"chat-a": 0.05}, swap_seconds=0.1).start()
    try:
        wait_for(
            lambda: Job.objects.filter(status=JobStatus.SUCCEEDED).count() == 4,
            timeout=60,  # the dispatcher's back-off between probes grows to 30 s
            message="the waiting jobs to run once llama-swap is back",
        )
        assert sorted(e["body"]["user"] for e in back.log()) == [f"waiting-{i}" for i in range(3)]
        wait_for(
            lambda: httpx.get(f"{web.url}/api/health/").json()["status"] == "ok",
            message="the health endpoint to report llama-swap up again",
        )
    finally:
        back.stop()
    assert not Job.objects.filter(status=JobStatus.FAILED).exists()
