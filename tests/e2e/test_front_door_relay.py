"""The OpenAI-compatible front door relays every llama-swap path, its answers
and its errors unchanged, and a job cancelled while its call waits answers
409: against one running system (simulator, GPU cluster, web server) that
the cases share, each with rows of its own (conftest.py's `running`).

In a module of their own: a case of tests/e2e/test_front_door.py that
starts its own cluster, run while this module's system is up, would have
its jobs taken by this module's cluster (one GPU name, one database)."""

import base64
import threading

import httpx
import pytest

from gpusched.stack import wait_for
from queueapp import services
from queueapp.models import Job, JobStatus
from queueapp.upstream.simulator import PNG_B64
from tests import factories
from tests.e2e.helpers import (
    assert_job_headers,
    assert_relayed_unchanged,
    ended,
    simulator_answer,
)

pytestmark = [pytest.mark.e2e]


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
