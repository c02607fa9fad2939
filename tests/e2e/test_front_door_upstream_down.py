"""A front-door call granted a GPU whose llama-swap refuses connections:
after a few tries its job goes back to the queue, and the caller, still
waiting on its open connection, is answered by another GPU. Real processes:
two simulators, a dispatcher cluster per GPU, Daphne.

gpu0 is the GPU granted first, whatever the timing: its row points the web
server at a closed port (the dispatcher keeps the URL it read at its start,
so gpu0 counts as healthy and may be granted), and gpu1 can take nothing
until gpu0 holds the call. Then gpu0's simulator stops, so that its
dispatcher sees it down too and does not take the returned job back.

And a call llama-swap takes and drops unanswered: a 502 with the job's
headers, and the job failed with the reason."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from gpusched.stack import free_port, wait_for
from queueapp import services
from queueapp.models import DispatchDecision, Gpu, Job, JobEvent, JobStatus
from queueapp.upstream.simulator import LlamaSwapSimulator
from tests import factories
from tests.e2e.helpers import assert_job_headers, ended

pytestmark = [pytest.mark.e2e]

# Enough for the refused connections, a cluster's start and the relay; the
# old front door never answered at all.
ANSWER_TIMEOUT_S = 45.0


@pytest.fixture
def two_simulators():
    sims = [LlamaSwapSimulator(models={"chat": 0.05}, swap_seconds=0.05).start() for _ in range(2)]
    yield sims
    for sim in sims:
        sim.stop()


def gpu_serving_chat(name: str) -> bool:
    return Gpu.objects.filter(name=name, reachable=True, served_models__contains=["chat"]).exists()


def gpu1_enabled(enabled: bool) -> None:
    gpu = Gpu.objects.get(name="gpu1")
    services.gpu_update(
        gpu=gpu,
        enabled=enabled,
        allowed_models=gpu.allowed_models,
        min_band=gpu.min_band,
        max_expected_seconds=gpu.max_expected_seconds,
    )


@pytest.mark.parametrize("gpu1_becomes_able", ["enabled", "started"])
def test_a_call_granted_where_llama_swap_refuses_is_answered_by_the_other_gpu(
    world, two_simulators, gpu1_becomes_able
):
    gpu0, gpu1 = two_simulators
    upstreams = f"gpu0={gpu0.url},gpu1={gpu1.url}"
    world.start_cluster(upstream_url=upstreams, GPUSCHED_GPU="gpu0")
    wait_for(lambda: gpu_serving_chat("gpu0"), message="gpu0's llama-swap to serve chat")
    if gpu1_becomes_able == "enabled":
        world.start_cluster(upstream_url=upstreams, GPUSCHED_GPU="gpu1")
        wait_for(lambda: gpu_serving_chat("gpu1"), message="gpu1's llama-swap to serve chat")
        gpu1_enabled(False)
    Gpu.objects.filter(name="gpu0").update(url=f"http://127.0.0.1:{free_port()}")
    web = world.start_web(upstream_url=upstreams)  # reads the GPUs' URLs from their rows
    _, token = factories.member("ann", "pro")

    with ThreadPoolExecutor(1) as caller:
        call = caller.submit(
            httpx.post,
            f"{web.url}/v1/chat/completions",
            json=factories.chat_body("chat", user="refused-then-answered"),
            headers={"Authorization": f"Bearer {token}"},
            timeout=ANSWER_TIMEOUT_S,
        )
        decision = wait_for(
            lambda: DispatchDecision.objects.select_related("gpu").first(),
            message="the call to be granted a GPU",
        )
        assert decision.gpu.name == "gpu0"
        gpu0.stop()
        if gpu1_becomes_able == "enabled":
            gpu1_enabled(True)
        else:
            world.start_cluster(upstream_url=upstreams, GPUSCHED_GPU="gpu1")
        answer = call.result()

    assert answer.status_code == 200, answer.text
    assert answer.headers["x-gpusched-job-id"] == str(decision.job_id)
    assert answer.json()["choices"][0]["message"]["content"].startswith("Simulated reply")
    assert [e["body"]["user"] for e in gpu1.log() if e["status"] == 200] == [
        "refused-then-answered"
    ]
    assert gpu0.log() == []
    # The caller gets its answer first; the web process writes the end meanwhile.
    job = wait_for(
        lambda: Job.objects.exclude(status=JobStatus.RUNNING).filter(pk=decision.job_id).first(),
        message="the job's end to be written",
    )
    assert job.status == JobStatus.SUCCEEDED and job.gpu.name == "gpu1"
    assert job.attempts == 1  # the refused grant ran nothing
    events = list(job.events.order_by("id"))
    assert [event.kind for event in events] == [
        JobEvent.Kind.SUBMITTED,
        JobEvent.Kind.STARTED,
        JobEvent.Kind.RETURNED_TO_QUEUE,
        JobEvent.Kind.STARTED,
        JobEvent.Kind.SUCCEEDED,
    ]
    assert "llama-swap unreachable at gpu0" in events[2].detail["reason"]
    assert list(job.decisions.order_by("id").values_list("gpu__name", flat=True)) == [
        "gpu0",
        "gpu1",
    ]
    assert not Job.objects.filter(status__in=(JobStatus.QUEUED, JobStatus.RUNNING)).exists()


@pytest.fixture
def hanging_up_upstream() -> Iterator[str]:
    """An upstream that takes the request and closes the connection unanswered."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve():
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:  # closed at teardown
                return
            with connection:
                connection.recv(65536)

    threading.Thread(target=serve, daemon=True).start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    listener.close()


def test_a_call_llama_swap_drops_answers_502_with_the_job_headers(world, hanging_up_upstream):
    world.start_cluster()  # grants the GPU; the web server's own call is dropped:
    # web servers call the URL the GPU's row holds (its dispatcher probes its own).
    Gpu.objects.filter(name="gpu0").update(url=hanging_up_upstream)
    web = world.start_web()
    _, token = factories.member("ann-member", "pro")
    answer = httpx.post(
        f"{web.url}/v1/chat/completions",
        json={"model": "chat-a", "messages": []},
        headers={"Authorization": f"Bearer {token}", "X-LlamaSwap-Priority": "interactive"},
        timeout=30,
    )
    assert answer.status_code == 502 and answer.json()["error"]["code"] == "upstream_error"
    job = ended(Job.objects.get(front_door=True).pk)
    assert job.status == JobStatus.FAILED and "llama-swap failed" in job.error
    assert_job_headers(answer.headers, job)
    assert answer.headers["x-gpusched-priority-applied"] == "100"
