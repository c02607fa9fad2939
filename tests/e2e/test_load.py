"""Load, small: 300 submissions from 10 concurrent clients against the real web server.

Each is recorded exactly once, none gets a 5xx, the queue's invariants hold
(queueapp/integrity.py), and a real cluster then runs each job exactly once.
`make load` runs the long variant (benchmarks/load.py: 2,000 from 20 clients,
with the rate and latency figures); this one asserts no timing.
"""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from gpusched.stack import wait_for
from queueapp.integrity import queue_lines_violations, queue_order_violations
from queueapp.models import DispatchDecision, Job, JobStatus
from queueapp.services import policy_update
from queueapp.upstream.simulator import LlamaSwapSimulator
from tests import factories

pytestmark = [pytest.mark.e2e, pytest.mark.database_server, pytest.mark.slow]

SUBMISSIONS = 300
CLIENTS = 10
MEMBERS = 5  # two clients per member: their submissions race on one member's lines
MODELS = ("chat-a", "chat-b", "chat-c")
PRIORITIES = ("interactive", "normal", "batch", "50", "-20")


def submit_all(url: str, tokens: list[str]) -> list[tuple[str, int, int | None]]:
    """(label, status, job id) per submission; client c sends every CLIENTS-th label."""

    def client(c: int) -> list[tuple[str, int, int | None]]:
        answers = []
        headers = {"Authorization": f"Bearer {tokens[c % len(tokens)]}"}
        with httpx.Client(base_url=url, headers=headers, timeout=60) as http:
            for index in range(c, SUBMISSIONS, CLIENTS):
                label = f"load-{index:04d}"
                body = {"model": MODELS[index % 3], "messages": [], "user": label}
                try:
                    response = http.post(
                        "/api/jobs/",
                        json={"path": "/v1/chat/completions", "body": body},
                        headers={"X-LlamaSwap-Priority": PRIORITIES[index % len(PRIORITIES)]},
                    )
                except httpx.HTTPError:
                    answers.append((label, 0, None))  # a dropped connection counts as a 5xx
                    continue
                job_id = response.json()["id"] if response.status_code == 201 else None
                answers.append((label, response.status_code, job_id))
        return answers

    with ThreadPoolExecutor(CLIENTS) as pool:
        return [answer for answers in pool.map(client, range(CLIENTS)) for answer in answers]


def test_concurrent_submissions_are_recorded_once_in_order_and_run_once(world):
    members = [factories.member(f"load-{n}", ("free", "pro", "max")[n % 3]) for n in range(5)]
    _, staff_token = factories.member("load-staff", staff=True)
    factories.policy(dispatch_paused=True)  # the queue holds still while it is checked
    server = world.start_web(GPUSCHED_DB_POOL="10")  # as `make run` starts it

    answers = submit_all(server.url, [token for _, token in members])

    statuses = Counter(status for _, status, _ in answers)
    assert not [a for a in answers if a[1] >= 500 or a[1] == 0], statuses
    assert statuses == {201: SUBMISSIONS}
    recorded = Counter(Job.objects.values_list("body__user", "id"))
    assert set(recorded) == {(label, job_id) for label, _, job_id in answers}
    assert set(recorded.values()) == {1}
    assert Job.objects.count() == SUBMISSIONS
    assert queue_lines_violations() == []
    queue = httpx.get(
        f"{server.url}/api/queue/", headers={"Authorization": f"Bearer {staff_token}"}
    )
    assert queue.status_code == 200
    assert len(queue.json()["queued"]) == 200  # the view's limit: the first 200 in order
    assert queue_order_violations(queue.json()) == []

    fast = LlamaSwapSimulator(default_seconds=0, swap_seconds=0, accept_any_model=True).start()
    try:
        world.start_cluster(upstream_url=fast.url)
        policy_update(changes={"dispatch_paused": False})
        wait_for(
            lambda: Job.objects.filter(status=JobStatus.SUCCEEDED).count() == SUBMISSIONS,
            timeout=60,
            message=f"all {SUBMISSIONS} jobs dispatched",
        )
        served = Counter(entry["body"]["user"] for entry in fast.log())
    finally:
        fast.stop()
    assert served == Counter(label for label, _, _ in answers)  # each exactly once
    assert not Job.objects.filter(attempts__gt=1).exists()
    assert DispatchDecision.objects.count() == SUBMISSIONS
    assert DispatchDecision.objects.values("job").distinct().count() == SUBMISSIONS
