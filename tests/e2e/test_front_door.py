"""The OpenAI-compatible front door with the official `openai` package, against
Daphne, the real cluster and the simulator."""

import threading
import time

import httpx
import pytest
from openai import OpenAI

from queueapp.models import DispatchDecision, Job, JobStatus, Tier
from tests import factories
from tests.e2e.conftest import wait_for
from tests.e2e.test_scenarios import release_and_wait

pytestmark = [pytest.mark.e2e]


def client_for(web, token, **kwargs):
    return OpenAI(base_url=f"{web.url}/v1", api_key=token, timeout=60, max_retries=0, **kwargs)


def test_chat_embeddings_and_images_answer_as_llama_swap_does(world):
    world.start_cluster()
    web = world.start_web()
    _, token = factories.member("ann-member", "pro")
    client = client_for(web, token)

    raw = client.chat.completions.with_raw_response.create(
        model="chat-a",
        messages=[{"role": "user", "content": "hello"}],
        extra_headers={"X-LlamaSwap-Priority": "interactive"},
    )
    chat = raw.parse()
    job = Job.objects.get(pk=int(raw.headers["x-gpusched-job-id"]))
    assert job.status == JobStatus.SUCCEEDED and job.front_door
    assert chat.model_dump(exclude_unset=True) == job.result_body  # the simulator's answer
    assert chat.choices[0].message.content.startswith("Simulated reply")
    assert raw.headers["x-gpusched-priority-applied"] == "100"
    assert raw.headers["x-gpusched-why"] == f"/jobs/{job.pk}/why/"
    assert float(raw.headers["x-gpusched-score"]) > 100
    assert DispatchDecision.objects.filter(job=job).exists()

    embedding = client.embeddings.create(model="chat-a", input="hello")
    assert len(embedding.data[0].embedding) == 8
    image = client.images.generate(model="image-model", prompt="a fox")
    assert image.data[0].b64_json
    # Multipart: the model is a form field, as llama-swap reads it.
    transcript = client.audio.transcriptions.create(
        model="whisper", file=("hello.wav", b"RIFF0000WAVE", "audio/wav")
    )
    assert transcript.text
    assert Job.objects.get(path="/v1/audio/transcriptions").body["content_type"] == (
        "multipart/form-data"
    )
    models = httpx.get(f"{web.url}/v1/models", headers={"Authorization": f"Bearer {token}"})
    assert models.json() == world.simulator.list_models()
    served = [entry["path"] for entry in world.served()]
    assert served == [
        "/v1/chat/completions",
        "/v1/embeddings",
        "/v1/images/generations",
        "/v1/audio/transcriptions",
    ]


def test_streaming_chunks_arrive_before_the_job_finishes(world):
    world.start_cluster()
    web = world.start_web()
    _, token = factories.member("ann-member", "free")
    stream = client_for(web, token).chat.completions.create(
        model="chat-a",
        messages=[{"role": "user", "content": "tell me a story"}],
        stream=True,
        extra_body={"sim": {"seconds": 1.5}},
    )
    arrivals, pieces = [], []
    for chunk in stream:
        arrivals.append(time.time())
        pieces.append(chunk.choices[0].delta.content or "" if chunk.choices else "")
    job = wait_for(
        lambda: Job.objects.filter(status=JobStatus.SUCCEEDED).first(), what="the job to end"
    )
    assert len(arrivals) >= 3
    assert arrivals[0] < job.finished_at.timestamp() - 0.5  # streamed, not buffered
    assert "data: [DONE]" in job.result_body  # the relayed transcript is the result
    assert "".join(pieces)


def test_errors_come_in_openai_shape(world):
    web = world.start_web()
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


def test_priority_orders_concurrent_front_door_calls(world):
    """S1 through the front door: calls made at once from threads."""
    world.start_cluster()
    web = world.start_web()
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
    wait_for(lambda: Job.objects.filter(status=JobStatus.QUEUED).count() == 4, what="4 queued")
    order = release_and_wait(world, 4)
    for thread in threads:
        thread.join(timeout=30)
    assert order == ["free-normal", "max-batch", "pro-batch", "free-batch"]


def test_a_caller_that_disconnects_while_queued_cancels_its_job(world):
    world.start_cluster()
    web = world.start_web()
    _, token = factories.member("ann-member", "free")
    factories.policy(dispatch_paused=True)

    def impatient_call():
        try:
            httpx.post(
                f"{web.url}/v1/chat/completions",
                json={"model": "chat-a", "messages": []},
                headers={"Authorization": f"Bearer {token}"},
                timeout=1.0,  # gives up while the job is still queued
            )
        except httpx.TimeoutException:
            pass

    caller = threading.Thread(target=impatient_call)
    caller.start()
    job = wait_for(lambda: Job.objects.filter(front_door=True).first(), what="the job to queue")
    caller.join()
    wait_for(
        lambda: Job.objects.get(pk=job.pk).status == JobStatus.CANCELLED,
        what="the abandoned job to be cancelled",
    )
    factories.policy(dispatch_paused=False)
    assert world.simulator.log() == []  # llama-swap never received it


def test_a_caller_that_disconnects_mid_stream_leaves_the_dispatcher_healthy(world):
    world.start_cluster()
    web = world.start_web()
    _, token = factories.member("ann-member", "free")
    headers = {"Authorization": f"Bearer {token}"}
    body = {"model": "chat-a", "messages": [], "stream": True, "sim": {"seconds": 2.0}}
    with httpx.stream(
        "POST", f"{web.url}/v1/chat/completions", json=body, headers=headers, timeout=30
    ) as response:
        assert response.status_code == 200
        next(response.iter_raw())  # one chunk, then hang up
    job = Job.objects.get(front_door=True)
    wait_for(
        lambda: Job.objects.get(pk=job.pk).status == JobStatus.FAILED,
        what="the abandoned stream's job to end",
    )
    assert "disconnected" in Job.objects.get(pk=job.pk).error
    after = client_for(web, token).chat.completions.create(model="chat-a", messages=[])
    assert after.choices[0].message.content
