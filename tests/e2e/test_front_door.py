"""The OpenAI-compatible front door with the official `openai` package, against
Daphne, the real cluster and the simulator: one running system that the
cases share, each with rows of its own (conftest.py's `running`)."""

import base64
import json
import threading
import time

import httpx
import pytest
from openai.types.chat import ChatCompletionChunk

from gpusched.stack import wait_for
from queueapp.models import DispatchDecision, Job, JobStatus, Tier
from queueapp.upstream.simulator import PNG_B64
from tests import factories
from tests.e2e.helpers import (
    assert_job_headers,
    assert_relayed_unchanged,
    client_for,
    ended,
    release_and_wait,
    simulator_answer,
    streamed_text,
)

pytestmark = [pytest.mark.e2e]


def test_chat_embeddings_and_images_answer_as_llama_swap_does(running):
    web = running.servers[0]
    _, token = factories.member("ann-member", "pro")
    client = client_for(web, token)

    raw = client.chat.completions.with_raw_response.create(
        model="chat-a",
        messages=[{"role": "user", "content": "hello"}],
        extra_headers={"X-LlamaSwap-Priority": "interactive"},
    )
    chat = raw.parse()
    job = ended(int(raw.headers["x-gpusched-job-id"]))
    assert job.status == JobStatus.SUCCEEDED and job.front_door
    sent = simulator_answer(running.simulator, "/v1/chat/completions")
    assert_relayed_unchanged(raw, sent)
    assert chat.model_dump(exclude_unset=True) == json.loads(sent["body"])
    assert chat.choices[0].message.content.startswith("Simulated reply")
    assert raw.headers["x-gpusched-priority-applied"] == "100"
    assert raw.headers["x-gpusched-why"] == f"/jobs/{job.pk}/why/"
    assert float(raw.headers["x-gpusched-score"]) > 100
    assert DispatchDecision.objects.filter(job=job).exists()

    raw = client.embeddings.with_raw_response.create(model="chat-a", input="hello")
    sent = simulator_answer(running.simulator, "/v1/embeddings")
    assert_relayed_unchanged(raw, sent)
    assert raw.parse().data[0].embedding == json.loads(sent["body"])["data"][0]["embedding"]
    raw = client.images.with_raw_response.generate(model="image-model", prompt="a fox")
    sent = simulator_answer(running.simulator, "/v1/images/generations")
    assert_relayed_unchanged(raw, sent)
    assert base64.b64decode(raw.parse().data[0].b64_json) == base64.b64decode(PNG_B64)
    # Multipart: the model is a form field, as llama-swap reads it.
    raw = client.audio.transcriptions.with_raw_response.create(
        model="whisper", file=("hello.wav", b"RIFF0000WAVE", "audio/wav")
    )
    sent = simulator_answer(running.simulator, "/v1/audio/transcriptions")
    assert_relayed_unchanged(raw, sent)
    assert raw.parse().text == json.loads(sent["body"])["text"]
    assert Job.objects.get(path="/v1/audio/transcriptions").body["content_type"] == (
        "multipart/form-data"
    )
    models = httpx.get(f"{web.url}/v1/models", headers={"Authorization": f"Bearer {token}"})
    # Each listing is stamped with the second it was made (`created`): the
    # relayed one and the simulator's own may straddle a second.
    assert without_created(models.json()) == without_created(running.simulator.list_models())
    # The simulator logs an answer's status just after sending it.
    wait_for(lambda: len(running.served()) == 4, message="the four answers logged")
    served = [entry["path"] for entry in running.served()]
    assert served == [
        "/v1/chat/completions",
        "/v1/embeddings",
        "/v1/images/generations",
        "/v1/audio/transcriptions",
    ]


def test_streaming_chunks_arrive_before_the_job_finishes(running):
    web = running.servers[0]
    _, token = factories.member("ann-member", "free")
    raw = client_for(web, token).chat.completions.with_raw_response.create(
        model="chat-a",
        messages=[{"role": "user", "content": "tell me a story"}],
        stream=True,
        extra_body={"sim": {"seconds": 1.5}},
        extra_headers={"X-LlamaSwap-Priority": "batch"},
    )
    # Read line by line: a grant slower than the quiet time (a loaded
    # machine) sends a waiting comment first, and with it the head, unscored.
    arrivals, lines = [], []
    for line in raw.http_response.iter_lines():
        lines.append(line)
        if line.startswith("data: {"):
            arrivals.append(time.time())
    job = wait_for(
        lambda: Job.objects.filter(status=JobStatus.SUCCEEDED).first(), message="the job to end"
    )
    assert len(arrivals) >= 3
    assert arrivals[0] < job.finished_at.timestamp() - 0.5  # streamed, not buffered
    assert_job_headers(raw.headers, job, head_before_dispatch=lines[0].startswith(":"))
    sent = simulator_answer(running.simulator, "/v1/chat/completions")
    assert raw.headers["content-type"] == sent["content_type"]
    chunks = [
        ChatCompletionChunk.model_validate_json(line.removeprefix("data: "))
        for line in lines
        if line.startswith("data: {")
    ]
    pieces = [chunk.choices[0].delta.content or "" if chunk.choices else "" for chunk in chunks]
    assert "".join(pieces) == streamed_text(sent["body"]) != ""
    assert job.result_body == sent["body"].decode()  # the relayed transcript is the result


def test_errors_come_in_openai_shape(running):
    web = running.servers[0]
    _, token = factories.member("ann-member", "free")
    url = f"{web.url}/v1/chat/completions"
    anonymous = httpx.post(url, json={"model": "chat-a"})
    assert anonymous.status_code == 401
    assert anonymous.json()["error"]["code"] == "invalid_api_key"
    headers = {"Authorization": f"Bearer {token}"}
    no_model = httpx.post(url, json={"messages": []}, headers=headers)
    assert no_model.status_code == 400 and no_model.json()["error"]["message"].startswith("model")
    factories.policy(queue_open=False)
    closed = httpx.post(url, json={"model": "chat-a"}, headers=headers)
    assert closed.status_code == 503 and closed.json()["error"]["code"] == "queue_closed"
    factories.policy(queue_open=True)
    Tier.objects.filter(name="free").update(max_queued_jobs=0)
    limited = httpx.post(url, json={"model": "chat-a"}, headers=headers)
    assert limited.status_code == 429 and int(limited.headers["retry-after"]) >= 1
    assert limited.json()["error"]["type"] == "rate_limit_error"


def test_priority_orders_concurrent_front_door_calls(running):
    """S1 through the front door: calls made at once from threads."""
    web = running.servers[0]
    tokens = {tier: factories.member(f"{tier}-member", tier)[1] for tier in ("free", "pro", "max")}
    factories.policy(dispatch_paused=True)
    calls = [("free", "batch"), ("pro", "batch"), ("max", "batch"), ("free", "normal")]

    def call(tier, priority):
        client_for(web, tokens[tier]).chat.completions.create(
            model="chat-a",
            messages=[{"role": "user", "content": "hi"}],
            user=f"{tier}-{priority}",
            extra_headers={"X-LlamaSwap-Priority": priority},
        )

    threads = [threading.Thread(target=call, args=spec) for spec in calls]
    for thread in threads:
        thread.start()
    wait_for(lambda: Job.objects.filter(status=JobStatus.QUEUED).count() == 4, message="4 queued")
    order = release_and_wait(running, 4)
    for thread in threads:
        thread.join(timeout=30)
    assert order == ["free-normal", "max-batch", "pro-batch", "free-batch"]


def test_a_caller_that_disconnects_while_queued_cancels_its_job(running):
    web = running.servers[0]
    member, token = factories.member("ann-member", "free")
    factories.policy(dispatch_paused=True)

    def impatient_call():
        try:
            httpx.post(
                f"{web.url}/v1/chat/completions",
                json={"model": "chat-a", "messages": [], "user": "impatient"},
                headers={"Authorization": f"Bearer {token}"},
                timeout=1.0,  # gives up while the job is still queued
            )
        except httpx.TimeoutException:
            pass

    caller = threading.Thread(target=impatient_call)
    caller.start()
    job = wait_for(lambda: Job.objects.filter(front_door=True).first(), message="the job to queue")
    caller.join()
    wait_for(
        lambda: Job.objects.get(pk=job.pk).status == JobStatus.CANCELLED,
        message="the abandoned job to be cancelled",
    )
    # A later job is served; by then the cancelled one would have reached llama-swap too.
    factories.job(member, model="chat-a", label="later")
    factories.policy(dispatch_paused=False)
    wait_for(lambda: "later" in running.served_labels(), message="the later job to be served")
    assert [entry["body"]["user"] for entry in running.simulator.log()] == ["later"]


def test_a_caller_that_disconnects_mid_stream_leaves_the_dispatcher_healthy(running):
    web = running.servers[0]
    _, token = factories.member("ann-member", "free")
    headers = {"Authorization": f"Bearer {token}"}
    body = {"model": "chat-a", "messages": [], "stream": True, "sim": {"seconds": 2.0}}
    with httpx.stream(
        "POST", f"{web.url}/v1/chat/completions", json=body, headers=headers, timeout=30
    ) as response:
        assert response.status_code == 200
        # One chunk of the answer (after any waiting comment), then hang up.
        next(line for line in response.iter_lines() if line.startswith("data:"))
    job = Job.objects.get(front_door=True)
    wait_for(
        lambda: Job.objects.get(pk=job.pk).status == JobStatus.FAILED,
        message="the abandoned stream's job to end",
    )
    assert "disconnected" in Job.objects.get(pk=job.pk).error
    after = client_for(web, token).chat.completions.create(model="chat-a", messages=[])
    assert after.choices[0].message.content


def without_created(listing: dict) -> dict:
    """A `/v1/models` listing without its entries' `created` seconds."""
    return {
        **listing,
        "data": [
            {key: value for key, value in entry.items() if key != "created"}
            for entry in listing["data"]
        ],
    }
