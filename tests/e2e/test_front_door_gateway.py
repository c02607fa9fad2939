"""The front door under load and when its callers or its web process go away:
real Daphne, the real GPU cluster, the simulator, the official openai package."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import openai
import pytest
from django.db import connection

from gpusched.stack import wait_for
from queueapp import services
from queueapp.liveness import LIVE_GATEWAYS_SQL
from queueapp.models import Job, JobEvent, JobStatus, Tier
from tests import factories

pytestmark = [pytest.mark.e2e]

CALLERS = 300


def chat(model: str = "chat-a", seconds: float = 0.0, label: str = "") -> dict:
    """Keyword arguments of an openai chat call; `seconds` is the simulated GPU time."""
    return {
        "model": model,
        "messages": [{"role": "user", "content": "hi"}],
        "user": label,
        "extra_body": {"sim": {"seconds": seconds}},
    }


def assert_one_request_at_a_time(entries: list[dict]) -> None:
    """The simulator saw no request start before the one before it ended."""
    served = sorted(entries, key=lambda entry: entry["started_at"])
    for before, after in zip(served, served[1:], strict=False):
        assert after["started_at"] >= before["finished_at"], (before, after)


def health_seconds(web) -> float:
    """How long a plain GET /api/health/ takes now. A bound on how soon
    something happens adds five of these, so that it stretches with the load
    of a shared machine instead of failing under it."""
    started = time.monotonic()
    assert httpx.get(f"{web.url}/api/health/", timeout=30).status_code == 200
    return time.monotonic() - started


def live_gateway_numbers() -> set[int]:
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT objid FROM ({LIVE_GATEWAYS_SQL}) AS live(objid)",
        )
        return {int(row[0]) for row in cursor.fetchall()}


@pytest.fixture
def roomy_tiers(world):
    """Room in every tier's queue for a burst from one member."""
    Tier.objects.update(max_queued_jobs=10_000)


def test_300_concurrent_openai_callers_are_each_answered_one_at_a_time(world, roomy_tiers):
    world.start_cluster()
    web = world.start_web()
    _, token = factories.member("burst-member", "max")
    health: list[tuple[int, float]] = []
    burst_over = threading.Event()

    def poll_health() -> None:
        with httpx.Client(base_url=web.url, timeout=10) as http:
            while not burst_over.is_set():
                started = time.monotonic()
                status = http.get("/api/health/").status_code
                health.append((status, time.monotonic() - started))
                burst_over.wait(0.05)  # the polling rhythm, not a wait for a state

    async def burst() -> list:
        client = openai.AsyncOpenAI(
            base_url=f"{web.url}/v1", api_key=token, max_retries=0, timeout=120
        )
        async with client:
            return await asyncio.gather(
                *(
                    client.chat.completions.with_raw_response.create(
                        **chat(seconds=0.005, label=f"caller-{i}")
                    )
                    for i in range(CALLERS)
                ),
                return_exceptions=True,
            )

    poller = threading.Thread(target=poll_health)
    poller.start()
    try:
        answers = asyncio.run(burst())
    finally:
        burst_over.set()
        poller.join()
    failures = [answer for answer in answers if isinstance(answer, BaseException)]
    assert not failures, failures[:3]
    job_ids = {int(answer.headers["x-gpusched-job-id"]) for answer in answers}
    assert len(job_ids) == CALLERS  # one job per call
    labels = sorted(answer.parse().choices[0].message.content is not None for answer in answers)
    assert labels == [True] * CALLERS
    # The web process records a job's end just after its caller has the answer.
    wait_for(
        lambda: Job.objects.filter(pk__in=job_ids, status=JobStatus.SUCCEEDED).count() == CALLERS,
        message=f"the {CALLERS} jobs recorded as succeeded",
    )
    entries = world.simulator.log()
    assert [entry["status"] for entry in entries] == [200] * CALLERS  # no 429: never two at once
    assert sorted(entry["body"]["user"] for entry in entries) == sorted(
        f"caller-{i}" for i in range(CALLERS)
    )
    assert_one_request_at_a_time(entries)
    # Health answered all along (its speed is a benchmark's business).
    assert health and all(status == 200 for status, _ in health)


def test_a_killed_web_server_never_gets_a_grant_and_the_next_caller_is_served_at_once(
    world, roomy_tiers, gateways_judged
):
    world.start_cluster()
    doomed, survivor = world.start_web(), world.start_web()
    _, token = factories.member("kill-member", "max")
    waiting = 20
    # Measured first: between the callers seen waiting and the kill, no time
    # for another doomed job to be served.
    health = health_seconds(survivor)

    def call(url: str, label: str, seconds: float) -> None:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=token, max_retries=0, timeout=60)
        try:
            client.chat.completions.create(**chat(seconds=seconds, label=label))
        except openai.APIError:
            pass  # the doomed server's callers lose their connection

    callers = [
        threading.Thread(target=call, args=(doomed.url, f"doomed-{i}", 0.3), daemon=True)
        for i in range(waiting)
    ]
    # Every caller queued first, then one of them on the GPU: on a loaded
    # machine the callers could otherwise be served as fast as they arrive.
    factories.policy(dispatch_paused=True)
    for caller in callers:
        caller.start()
    wait_for(
        lambda: Job.objects.filter(status=JobStatus.QUEUED).count() == waiting,
        message="the doomed server's callers waiting",
    )
    factories.policy(dispatch_paused=False)
    wait_for(
        lambda: Job.objects.filter(status=JobStatus.RUNNING).exists(),
        message="one of the doomed server's callers on the GPU",
    )
    doomed_jobs = set(Job.objects.values_list("pk", flat=True))
    doomed.process.kill()  # SIGKILL: no cleanup of any kind
    killed_at = time.time()
    doomed.process.wait(timeout=10)
    call(survivor.url, "next-caller", 0.0)
    next_entry = next(e for e in world.simulator.log() if e["body"]["user"] == "next-caller")
    assert next_entry["status"] == 200
    # Within 2 s, including the doomed job that held the GPU at the kill; the
    # bound stretches with the machine's load.
    assert next_entry["started_at"] - killed_at < 2.0 + 5 * health
    wait_for(
        lambda: not Job.objects.filter(status__in=[JobStatus.QUEUED, JobStatus.RUNNING]).exists(),
        message="no job queued or running",
    )
    # No doomed job was granted after the kill (the claim's time, by the
    # database's clock on this machine).
    granted = dict(
        Job.objects.filter(pk__in=doomed_jobs, started_at__isnull=False).values_list(
            "body__user", "started_at"
        )
    )
    assert [label for label, at in granted.items() if at.timestamp() > killed_at] == []
    # At the simulator after the kill: the next caller, and at most the doomed
    # call already sent, which a loaded test process may log late.
    after_kill = [
        entry["body"]["user"]
        for entry in world.simulator.log()
        if entry["started_at"] and entry["started_at"] > killed_at
    ]
    late = [label for label in after_kill if label != "next-caller"]
    assert after_kill.count("next-caller") == 1
    assert len(late) <= 1 and set(late) <= set(granted)
    statuses = dict(Job.objects.filter(pk__in=doomed_jobs).values_list("pk", "status"))
    cancelled = [pk for pk, status in statuses.items() if status == JobStatus.CANCELLED]
    assert len(cancelled) >= waiting - 2
    never_granted = set(doomed_jobs) - set(
        Job.objects.filter(started_at__isnull=False).values_list("pk", flat=True)
    )
    assert set(cancelled) == never_granted
    assert set(statuses.values()) <= {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED}
    reasons = JobEvent.objects.filter(job_id__in=cancelled, kind="cancelled")
    assert all("web process" in event.detail["by"] for event in reasons)


def test_a_grant_whose_caller_is_gone_frees_the_gpu_within_a_second(world, roomy_tiers):
    world.start_cluster()
    web = world.start_web()
    owner, token = factories.member("gone-member", "max")
    openai.OpenAI(base_url=f"{web.url}/v1", api_key=token, max_retries=0).chat.completions.create(
        **chat(label="first")
    )
    (number,) = live_gateway_numbers()
    health = health_seconds(web)
    # A front-door job of that live web process whose caller has already left:
    # the process holds no waiting call for it.
    orphan = services.job_submit(
        member=owner,
        path="/v1/chat/completions",
        body={"model": "chat-a", "messages": []},
        model="chat-a",
        priority_header="interactive",
        front_door=True,
        gateway=number,
    )
    after = factories.job(owner, model="chat-a", label="after")
    wait_for(
        lambda: Job.objects.get(pk=after.pk).status == JobStatus.SUCCEEDED,
        message="the REST job after the orphan",
    )
    orphan.refresh_from_db()
    assert orphan.status == JobStatus.FAILED and "caller left" in orphan.error
    assert orphan.started_at is not None
    # Within a second; the bound stretches with the machine's load.
    assert (orphan.finished_at - orphan.started_at).total_seconds() < 1.0 + 5 * health
    assert [e["body"].get("user") for e in world.served()] == ["first", "after"]


def test_past_the_waiting_limit_a_call_is_refused_with_429_and_queues_nothing(world, roomy_tiers):
    world.start_cluster()
    web = world.start_web(GPUSCHED_FRONT_DOOR_MAX_WAITING="2")
    _, token = factories.member("limit-member", "max")
    factories.policy(dispatch_paused=True)
    client = openai.OpenAI(base_url=f"{web.url}/v1", api_key=token, max_retries=0, timeout=60)
    callers = [
        threading.Thread(
            target=client.chat.completions.create, kwargs=chat(label=f"w{i}"), daemon=True
        )
        for i in range(2)
    ]
    for caller in callers:
        caller.start()
    wait_for(lambda: Job.objects.filter(status=JobStatus.QUEUED).count() == 2, message="2 queued")
    with pytest.raises(openai.RateLimitError) as refused:
        client.chat.completions.create(**chat(label="third"))
    assert refused.value.response.headers["retry-after"] == "1"
    error = refused.value.response.json()["error"]
    assert error["code"] == "too_many_waiting" and error["type"] == "rate_limit_error"
    assert "GPUSCHED_FRONT_DOOR_MAX_WAITING" in error["message"]
    assert Job.objects.count() == 2
    factories.policy(dispatch_paused=False)
    for caller in callers:
        caller.join(timeout=30)
    wait_for(lambda: len(world.served()) == 2, message="both waiting calls served")
