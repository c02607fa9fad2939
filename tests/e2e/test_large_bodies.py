"""Real-size bodies through the front door of a real web server (Daphne), the
real cluster and the simulator, which the cases share (conftest.py's
`running`): a vision chat of about 5 MB (a base64 image in an `image_url`
part) and a 20 MB audio file for a transcription. Each reaches llama-swap
byte for byte, as the simulator's log (`GET /sim/log`: `body_bytes`,
`body_sha256`) records it, and the job's row keeps a summary of the vision
chat, not its megabytes."""

from __future__ import annotations

import base64
import hashlib
import json
import random

import httpx
import pytest
from django.db import connection

from gpusched.stack import wait_for
from queueapp.models import JobStatus
from tests import factories
from tests.e2e.helpers import ended

pytestmark = [pytest.mark.e2e]

IMAGE_BYTES = 3_750_000  # 5,000,000 characters of base64
AUDIO_BYTES = 20_000_000
PROMPT = "What is in this picture?"
# Far under either body: what a summary of the request takes, not its payload.
STORED_BODY_LIMIT = 64 * 1024
TIMEOUT = httpx.Timeout(120, connect=10)


def vision_chat(model: str) -> bytes:
    """A chat with a photo as a data URL, as the openai package sends it. The
    image is random bytes: a JPEG does not compress either."""
    image = base64.b64encode(random.Random(1).randbytes(IMAGE_BYTES)).decode()
    content = [
        {"type": "text", "text": PROMPT},
        {"type": "image_url", "image_url": {"url": f"data:image/jpeg;base64,{image}"}},
    ]
    body = {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 64}
    return json.dumps(body).encode()


def received(simulator, path: str) -> dict:
    """The simulator's log entry of its one answered request on `path`, read
    over HTTP as any client of it would."""

    def answered() -> dict | None:
        log = httpx.get(f"{simulator.url}/sim/log", timeout=TIMEOUT).json()
        entries = [entry for entry in log if entry["path"] == path]
        assert len(entries) <= 1, entries
        return entries[0] if entries and entries[0]["status"] is not None else None

    return wait_for(answered, message=f"the simulator's answer on {path}", interval=0.1)


def relayed_byte_for_byte(simulator, answer: httpx.Response, path: str, model: str, sent: bytes):
    """The call's job, once it has ended: it succeeded, and the simulator
    answered its request having received `sent`, byte for byte."""
    job = ended(int(answer.headers["x-gpusched-job-id"]))
    assert job.status == JobStatus.SUCCEEDED and job.front_door
    entry = received(simulator, path)
    assert (entry["status"], entry["model"]) == (200, model)
    assert (entry["body_bytes"], entry["body_sha256"]) == (
        len(sent),
        hashlib.sha256(sent).hexdigest(),
    )
    return job


def stored_body_bytes(job_id: int) -> tuple[int, int]:
    """The job's `body` as PostgreSQL holds it (after compression) and as JSON text."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_column_size(body), octet_length(body::text) FROM queueapp_job WHERE id = %s",
            [job_id],
        )
        return cursor.fetchone()


def test_a_5_mb_vision_chat_reaches_llama_swap_byte_for_byte_and_only_its_summary_is_stored(
    running,
):
    web = running.servers[0]
    _, token = factories.member("ann-member", "pro")
    sent = vision_chat("chat-a")
    assert len(sent) > 5_000_000

    answer = httpx.post(
        f"{web.url}/v1/chat/completions",
        content=sent,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        timeout=TIMEOUT,
    )

    assert answer.status_code == 200, answer.text[:500]
    assert answer.json()["object"] == "chat.completion"
    job = relayed_byte_for_byte(running.simulator, answer, "/v1/chat/completions", "chat-a", sent)
    # The summary still says what was asked; the image is not in it.
    assert job.body["model"] == "chat-a"
    assert PROMPT in json.dumps(job.body)
    column, text = stored_body_bytes(job.pk)
    assert text < STORED_BODY_LIMIT, f"the job's body is {text} bytes of JSON in the row"
    assert column < STORED_BODY_LIMIT


def test_a_20_mb_transcription_reaches_llama_swap_byte_for_byte(running):
    web = running.servers[0]
    _, token = factories.member("ann-member", "pro")
    audio = random.Random(2).randbytes(AUDIO_BYTES)

    with httpx.Client(timeout=TIMEOUT) as client:
        request = client.build_request(
            "POST",
            f"{web.url}/v1/audio/transcriptions",
            headers={"Authorization": f"Bearer {token}"},
            # Served: the end-to-end simulator answers any model (e2e_simulator).
            data={"model": "whisper"},
            files={"file": ("speech.wav", audio, "audio/wav")},
        )
        sent = request.read()  # the multipart body exactly as it goes on the wire
        answer = client.send(request)

    assert len(sent) > AUDIO_BYTES
    assert answer.status_code == 200, answer.text[:500]
    assert isinstance(answer.json()["text"], str)
    job = relayed_byte_for_byte(
        running.simulator, answer, "/v1/audio/transcriptions", "whisper", sent
    )
    assert job.body["model"] == "whisper"
    column, text = stored_body_bytes(job.pk)
    assert text < STORED_BODY_LIMIT and column < STORED_BODY_LIMIT
