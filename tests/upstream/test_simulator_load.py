"""The simulator's load without a request, as llama-swap's: GET /upstream/<model>/
swaps the model in and answers with its server's page (LlamaSwapClient.preload)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import httpx

from gpusched.stack import wait_for
from queueapp.upstream.client import LlamaSwapClient, preload_request_path
from queueapp.upstream.simulator import LlamaSwapSimulator


def test_a_load_costs_the_swap_then_the_model_is_resident_and_logged(
    make_sim: Callable[..., LlamaSwapSimulator],
) -> None:
    sim = make_sim(models={"chat": 0.05, "org/image": 0.05}, swap_seconds=0.3)
    client = LlamaSwapClient(sim.url, job_timeout=5)
    began = time.monotonic()
    answer = client.preload("org/image", job_id=1)
    assert time.monotonic() - began >= 0.3
    assert answer.status_code == 200 and answer.json() == {
        "model": "org/image",
        "loaded": True,
        "already_resident": False,
        "upstream_status": 200,
    }
    (resident,) = sim.running()["running"]
    assert (resident["model"], resident["state"]) == ("org/image", "ready")
    # Its status is logged as the slot frees, which may come just after the answer.
    (entry,) = wait_for(lambda: [e for e in sim.log() if e["status"] is not None], message="log")
    assert entry["path"] == preload_request_path("org/image") == "/upstream/org/image/"
    assert (entry["model"], entry["swapped"], entry["status"]) == ("org/image", True, 200)
    assert (entry["load_seconds"], entry["run_seconds"]) == (0.3, 0.0)


def test_a_load_of_the_resident_model_swaps_nothing(
    make_sim: Callable[..., LlamaSwapSimulator],
) -> None:
    sim = make_sim(initial_model="chat", swap_seconds=5.0)
    answer = httpx.get(f"{sim.url}/upstream/chat/", timeout=2)
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/html")
    assert [(e["swapped"], e["load_seconds"]) for e in sim.log()] == [(False, 0.0)]


def test_an_unknown_model_is_404_and_a_path_without_its_slash_is_redirected(
    make_sim: Callable[..., LlamaSwapSimulator],
) -> None:
    sim = make_sim()
    client = LlamaSwapClient(sim.url, job_timeout=5)
    refused = client.preload("nope", job_id=2)
    assert (refused.status_code, refused.error_message()) == (404, "model not found")
    moved = httpx.get(f"{sim.url}/upstream/chat", timeout=2)
    assert (moved.status_code, moved.headers["location"]) == (301, "/upstream/chat/")
    assert sim.running() == {"running": []} and sim.log() == []


def test_a_load_while_another_model_runs_is_refused_with_429(
    make_sim: Callable[..., LlamaSwapSimulator],
) -> None:
    sim = make_sim(models={"chat": 2.0, "image": 0.05})
    with httpx.Client(base_url=sim.url, timeout=5) as http:
        running = threading.Thread(
            target=http.post,
            args=("/v1/chat/completions",),
            kwargs={"json": {"model": "chat", "messages": []}},
        )
        running.start()
        wait_for(lambda: any(e["started_at"] for e in sim.log()), message="the chat admitted")
        answer = LlamaSwapClient(sim.url, job_timeout=5).preload("image", job_id=3)
        assert answer.is_busy and answer.retry_after is not None
        running.join()
