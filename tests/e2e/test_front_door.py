"""The OpenAI-compatible front door with the official `openai` package, against
Daphne, the real cluster and the simulator."""

import base64
import json
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from django.db import connection as db_connection

from gpusched.stack import wait_for
from queueapp import services
from queueapp.models import DispatchDecision, Gpu, Job, JobStatus, Tier
from queueapp.upstream.simulator import PNG_B64, LlamaSwapSimulator
from tests import factories
from tests.e2e.helpers import World, client_for, ended, release_and_wait, streamed_text

pytestmark = [pytest.mark.e2e]


def simulator_answer(simulator, path):
    """What the simulator itself sent for the latest request it logged on `path`."""
    *_, entry = [entry for entry in simulator.log() if entry["path"] == path]
    return simulator.sent(entry["seq"])


def assert_relayed_unchanged(answer, sent):
    """`answer` (httpx's or the openai package's raw response) is what was `sent`."""
    relayed = (answer.status_code, answer.headers["content-type"], answer.content)
    assert relayed == (sent["status"], sent["content_type"], sent["body"])


def assert_job_headers(headers, job):
    assert headers["x-gpusched-job-id"] == str(job.pk)
    assert headers["x-gpusched-priority-requested"] == str(job.priority_requested)
    assert headers["x-gpusched-priority-applied"] == str(job.priority)
    assert headers["x-gpusched-why"] == f"/jobs/{job.pk}/why/"
    score = (job.score_at_dispatch or {}).get("effective")
    if score is None:
        assert headers["x-gpusched-score"] == ""  # never ranked for the GPU
    else:
        assert float(headers["x-gpusched-score"]) == pytest.approx(score, rel=1e-5)


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
    job = ended(int(raw.headers["x-gpusched-job-id"]))
    assert job.status == JobStatus.SUCCEEDED and job.front_door
    sent = simulator_answer(world.simulator, "/v1/chat/completions")
    assert_relayed_unchanged(raw, sent)
    assert chat.model_dump(exclude_unset=True) == json.loads(sent["body"])
    assert chat.choices[0].message.content.startswith("Simulated reply")
    assert raw.headers["x-gpusched-priority-applied"] == "100"
    assert raw.headers["x-gpusched-why"] == f"/jobs/{job.pk}/why/"
    assert float(raw.headers["x-gpusched-score"]) > 100
    assert DispatchDecision.objects.filter(job=job).exists()

    raw = client.embeddings.with_raw_response.create(model="chat-a", input="hello")
    sent = simulator_answer(world.simulator, "/v1/embeddings")
    assert_relayed_unchanged(raw, sent)
    assert raw.parse().data[0].embedding == json.loads(sent["body"])["data"][0]["embedding"]
    raw = client.images.with_raw_response.generate(model="image-model", prompt="a fox")
    sent = simulator_answer(world.simulator, "/v1/images/generations")
    assert_relayed_unchanged(raw, sent)
    assert base64.b64decode(raw.parse().data[0].b64_json) == base64.b64decode(PNG_B64)
    # Multipart: the model is a form field, as llama-swap reads it.
    raw = client.audio.transcriptions.with_raw_response.create(
        model="whisper", file=("hello.wav", b"RIFF0000WAVE", "audio/wav")
    )
    sent = simulator_answer(world.simulator, "/v1/audio/transcriptions")
    assert_relayed_unchanged(raw, sent)
    assert raw.parse().text == json.loads(sent["body"])["text"]
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
    raw = client_for(web, token).chat.completions.with_raw_response.create(
        model="chat-a",
        messages=[{"role": "user", "content": "tell me a story"}],
        stream=True,
        extra_body={"sim": {"seconds": 1.5}},
        extra_headers={"X-LlamaSwap-Priority": "batch"},
    )
    arrivals, pieces = [], []
    for chunk in raw.parse():
        arrivals.append(time.time())
        pieces.append(chunk.choices[0].delta.content or "" if chunk.choices else "")
    job = wait_for(
        lambda: Job.objects.filter(status=JobStatus.SUCCEEDED).first(), message="the job to end"
    )
    assert len(arrivals) >= 3
    assert arrivals[0] < job.finished_at.timestamp() - 0.5  # streamed, not buffered
    assert_job_headers(raw.headers, job)
    sent = simulator_answer(world.simulator, "/v1/chat/completions")
    assert raw.headers["content-type"] == sent["content_type"]
    assert "".join(pieces) == streamed_text(sent["body"]) != ""
    assert job.result_body == sent["body"].decode()  # the relayed transcript is the result


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
    wait_for(lambda: Job.objects.filter(status=JobStatus.QUEUED).count() == 4, message="4 queued")
    order = release_and_wait(world, 4)
    for thread in threads:
        thread.join(timeout=30)
    assert order == ["free-normal", "max-batch", "pro-batch", "free-batch"]


def test_a_caller_that_disconnects_while_queued_cancels_its_job(world):
    world.start_cluster()
    web = world.start_web()
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
    wait_for(lambda: "later" in world.served_labels(), message="the later job to be served")
    assert [entry["body"]["user"] for entry in world.simulator.log()] == ["later"]


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
        message="the abandoned stream's job to end",
    )
    assert "disconnected" in Job.objects.get(pk=job.pk).error
    after = client_for(web, token).chat.completions.create(model="chat-a", messages=[])
    assert after.choices[0].message.content


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


# The tests below share one running system (simulator, GPU cluster, web
# server) rather than starting one per case; each case writes its own rows
# and `transactional_db` empties the tables after it.


@pytest.fixture(scope="module")
def running_system(django_db_setup, tmp_path_factory) -> Iterator[World]:
    simulator = LlamaSwapSimulator(
        models={"chat-a": 0.05}, default_seconds=0.05, accept_any_model=True, swap_seconds=0.1
    ).start()
    try:
        with World(simulator, tmp_path_factory.mktemp("front-door")) as system:
            system.start_cluster()
            system.start_web()  # audio answers are stored in the test's folder, not the project's
            yield system
    finally:
        simulator.stop()


@pytest.fixture
def running(running_system, transactional_db) -> World:
    factories.policy()
    factories.tiers()
    running_system.simulator.reset_log()
    # The flush after each case (TRUNCATE) can deadlock with the still running
    # cluster's queries; PostgreSQL aborts whichever session checks first. The
    # cluster retries an aborted query, the flush would not: let the cluster
    # check first (it keeps the 1 s default).
    with db_connection.cursor() as cursor:
        cursor.execute("SET deadlock_timeout = '10s'")
    return running_system


def test_a_job_cancelled_before_it_ran_answers_409_with_the_job_headers(running):
    web = running.servers[0]
    member, token = factories.member("ann-member", "free")
    factories.policy(dispatch_paused=True)
    answers = []

    def waiting_call():
        answers.append(
            httpx.post(
                f"{web.url}/v1/chat/completions",
                json={"model": "chat-a", "messages": []},
                headers={"Authorization": f"Bearer {token}", "X-LlamaSwap-Priority": "batch"},
                timeout=30,
            )
        )

    caller = threading.Thread(target=waiting_call)
    caller.start()
    job = wait_for(lambda: Job.objects.filter(front_door=True).first(), message="the job to queue")
    services.job_cancel(job=job, by=member.name)
    caller.join(timeout=30)
    (answer,) = answers
    assert answer.status_code == 409 and answer.json()["error"]["code"] == "job_cancelled"
    assert_job_headers(answer.headers, Job.objects.get(pk=job.pk))
    assert running.simulator.log() == []


def multipart(model):
    return {
        "files": {"image": ("fox.png", base64.b64decode(PNG_B64), "image/png")},
        "data": {"model": model, "prompt": "add a hat"},
    }


COMPLETION = {"model": "chat-a", "prompt": "hello"}
RESPONSE = {"model": "chat-a", "input": "hello"}
SPEECH = {"model": "tts", "input": "hello", "voice": "alloy"}
TXT2IMG = {"model": "sd", "prompt": "a fox", "steps": 4}


@pytest.mark.parametrize(
    ("path", "request_kwargs", "content_type", "error_status"),
    [
        ("/v1/completions", {"json": {**COMPLETION, "stream": True}}, "text/event-stream", 500),
        ("/v1/responses", {"json": RESPONSE}, "application/json", 503),
        # Multipart carries no `sim` object to force an error with.
        ("/v1/images/edits", multipart("image-model"), "application/json", None),
        ("/v1/audio/speech", {"json": SPEECH}, "audio/wav", 400),
        ("/sdapi/v1/txt2img", {"json": TXT2IMG}, "application/json", 404),
        # llama-swap's own 502 passes as it is, not as the front door's.
        ("/sdapi/v1/img2img", {"json": TXT2IMG}, "application/json", 502),
    ],
    ids=["completions", "responses", "images-edits", "speech", "txt2img", "img2img"],
)
def test_answers_and_errors_pass_through_unchanged(
    running, path, request_kwargs, content_type, error_status
):
    """One answer and, where the body can ask the simulator for it, one
    llama-swap error: status, content type and body as the simulator sent them."""
    _, token = factories.member("ann-member", "free")
    calls = [(request_kwargs, 200, content_type)]
    if error_status is not None:
        failing = {"json": {**request_kwargs["json"], "sim": {"status": error_status}}}
        calls.append((failing, error_status, "application/json"))
    for kwargs, status, expected_type in calls:
        answer = httpx.post(
            f"{running.servers[0].url}{path}",
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
            **kwargs,
        )
        sent = simulator_answer(running.simulator, path)
        assert (sent["status"], sent["content_type"]) == (status, expected_type)
        assert_relayed_unchanged(answer, sent)
        job = ended(int(answer.headers["x-gpusched-job-id"]))
        assert job.result_status_code == status
        assert job.status == (JobStatus.SUCCEEDED if status == 200 else JobStatus.FAILED)
