"""A band asked for in the body through the official `openai` package, and the
band a path gets when the call names none, against Daphne, the real cluster
and the simulator, one running system that the cases share (conftest.py's
`running`): the simulator's log shows what llama-swap received."""

import hashlib
import json

import httpx
import pytest

from gpusched.stack import wait_for
from queueapp.models import JobStatus
from tests import factories
from tests.e2e.helpers import client_for, ended

pytestmark = [pytest.mark.e2e]


class Sent:
    """The requests an httpx client sent, their bodies as they went out."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.client = httpx.Client(event_hooks={"request": [self._keep]})

    def _keep(self, request: httpx.Request) -> None:
        self.bodies.append(request.read())


def received(simulator, path: str) -> dict:
    """The simulator's log entry of the latest request on `path`, once it
    has its status: the simulator records it just after its answer went,
    so the caller may hold the answer first."""

    def answered() -> dict | None:
        *_, entry = [entry for entry in simulator.log() if entry["path"] == path]
        return entry if entry["status"] is not None else None

    return wait_for(answered, message=f"the simulator's answer on {path}")


def sha256(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


def test_a_body_priority_is_applied_and_never_reaches_llama_swap(running):
    web = running.servers[0]
    _, token = factories.member("ann-member", "free")
    sent = Sent()
    client = client_for(web, token, http_client=sent.client)
    chat = {"model": "chat-a", "messages": [{"role": "user", "content": "hello"}]}

    raw = client.chat.completions.with_raw_response.create(**chat, extra_body={"priority": "batch"})
    assert raw.headers["x-gpusched-priority-applied"] == "-100"
    assert ended(int(raw.headers["x-gpusched-job-id"])).status == JobStatus.SUCCEEDED
    asked = json.loads(sent.bodies[-1])
    assert asked["priority"] == "batch"  # the SDK did send it
    entry = received(running.simulator, "/v1/chat/completions")
    assert "priority" not in entry["body"]
    assert entry["body"] == {key: value for key, value in asked.items() if key != "priority"}
    # The rest went as the caller wrote it: the SDK's bytes less the one member.
    without = sent.bodies[-1].replace(b',"priority":"batch"', b"")
    assert len(without) < len(sent.bodies[-1])
    assert entry["body_sha256"] == sha256(without)

    # The header wins over the body; the tier's cap clamps either.
    raw = client.chat.completions.with_raw_response.create(
        **chat,
        extra_body={"priority": "background"},
        extra_headers={"X-LlamaSwap-Priority": "interactive"},
    )
    assert raw.headers["x-gpusched-priority-applied"] == "100"
    assert "priority" not in received(running.simulator, "/v1/chat/completions")["body"]
    raw = client.chat.completions.with_raw_response.create(**chat, extra_body={"priority": 10**6})
    requested = (
        raw.headers["x-gpusched-priority-requested"],
        raw.headers["x-gpusched-priority-applied"],
    )
    assert requested == ("1000000", "100")

    # Without a priority, a chat is normal, and llama-swap gets the caller's bytes.
    raw = client.chat.completions.with_raw_response.create(**chat)
    assert raw.headers["x-gpusched-priority-applied"] == "0"
    assert received(running.simulator, "/v1/chat/completions")["body_sha256"] == sha256(
        sent.bodies[-1]
    )


def test_speech_and_transcriptions_go_first_unless_told_and_arrive_byte_for_byte(running):
    web = running.servers[0]
    _, token = factories.member("ann-member", "free")
    sent = Sent()
    client = client_for(web, token, http_client=sent.client)

    raw = client.audio.speech.with_raw_response.create(model="voice", voice="alloy", input="hi")
    assert raw.headers["x-gpusched-priority-applied"] == "100"
    job = ended(int(raw.headers["x-gpusched-job-id"]))
    assert (job.status, job.priority_requested, job.priority) == (JobStatus.SUCCEEDED, 100, 100)
    assert received(running.simulator, "/v1/audio/speech")["body_sha256"] == sha256(sent.bodies[-1])

    # A multipart body: the model from its form field, the bytes relayed untouched.
    audio = bytes(range(256)) * 64  # every byte value, CR and LF among them
    raw = client.audio.transcriptions.with_raw_response.create(
        model="whisper", file=("hello.wav", audio, "audio/wav"), language="en"
    )
    assert raw.headers["x-gpusched-priority-applied"] == "100"
    entry = received(running.simulator, "/v1/audio/transcriptions")
    assert entry["model"] == "whisper" and entry["status"] == 200
    assert len(sent.bodies[-1]) > len(audio)
    assert (entry["body_bytes"], entry["body_sha256"]) == (
        len(sent.bodies[-1]),
        sha256(sent.bodies[-1]),
    )

    # The header still decides; so does a body's priority for speech.
    raw = client.audio.transcriptions.with_raw_response.create(
        model="whisper",
        file=("hello.wav", audio, "audio/wav"),
        extra_headers={"X-LlamaSwap-Priority": "batch"},
    )
    assert raw.headers["x-gpusched-priority-applied"] == "-100"
    raw = client.audio.speech.with_raw_response.create(
        model="voice", voice="alloy", input="hi", extra_body={"priority": "normal"}
    )
    assert raw.headers["x-gpusched-priority-applied"] == "0"
    assert "priority" not in received(running.simulator, "/v1/audio/speech")["body"]
