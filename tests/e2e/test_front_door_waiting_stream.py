"""A streaming front-door call that waits in the queue: SSE comment lines
while queued, then llama-swap's own lines byte for byte; an error after the
first comment as one `data:` line. Daphne, the real cluster, the simulator,
httpx and the openai package."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import httpx
import openai
import pytest

from gpusched.stack import wait_for
from queueapp.models import Job, JobStatus
from tests import factories
from tests.e2e.helpers import client_for, ended

pytestmark = [pytest.mark.e2e]

COMMENT_SECONDS = "0.3"
COMMENTS = re.compile(rb"\A(?:: [^\n]*\n\n)+")
# Nothing of chat-a is learned yet when the GPU is first held: the start is a guess.
FIRST_COMMENT = re.compile(
    r"^: queued, position 1, estimated start in \d+ s \(a guess: a job ahead has no "
    r"estimate yet\); gpu0 runs job (\d+) \(chat-a, \d+\.\d s held\)\n\n$"
)


@pytest.fixture
def web(world):
    world.start_cluster()
    return world.start_web(GPUSCHED_STREAM_COMMENT_SECONDS=COMMENT_SECONDS)


@pytest.fixture
def token(world) -> str:
    return factories.member("ann-member", "free")[1]


def chat(**extra) -> dict:
    return {"model": "chat-a", "messages": [{"role": "user", "content": "hi"}], **extra}


@contextmanager
def gpu_held(web, token) -> Iterator[int]:
    """A front-door stream that holds the GPU (its first chunk has come)
    until the block ends, when its caller hangs up and the GPU frees;
    yields its job's id."""
    with httpx.stream(
        "POST",
        f"{web.url}/v1/chat/completions",
        json=chat(stream=True, sim={"seconds": 120}),
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    ) as holding:
        assert holding.status_code == 200
        chunks = holding.iter_raw()  # kept: a dropped iterator closes the connection
        next(chunks)
        yield int(holding.headers["x-gpusched-job-id"])


class Lines:
    """A streamed answer read as it arrives: when each comment line came."""

    def __init__(self, response: httpx.Response, started: float) -> None:
        self.chunks = response.iter_raw()
        self.started = started
        self.body = b""
        self.comment_times: list[float] = []

    def read_comments(self, count: int) -> None:
        while len(self.comment_times) < count:
            self.body += next(self.chunks)
            arrived = time.monotonic() - self.started
            seen = COMMENTS.match(self.body)
            blocks = seen.group(0).count(b"\n\n") if seen else 0
            self.comment_times += [arrived] * (blocks - len(self.comment_times))

    def read_rest(self) -> tuple[bytes, bytes]:
        """The comment lines, and what followed them."""
        for chunk in self.chunks:
            self.body += chunk
        comments = COMMENTS.match(self.body)
        assert comments is not None, self.body[:200]
        return comments.group(0), self.body[comments.end() :]


def simulator_sent(world, job_count: int) -> dict:
    """What the simulator sent for the latest chat request, once it has
    logged `job_count` of them."""
    entries = wait_for(
        lambda: (
            [e for e in world.simulator.log() if e["path"] == "/v1/chat/completions"]
            if len(world.simulator.log()) >= job_count
            else None
        ),
        message=f"{job_count} requests logged",
    )
    return world.simulator.sent(entries[-1]["seq"])


def test_a_waiting_stream_gets_comments_at_once_then_llama_swaps_lines_unchanged(world, web, token):
    with ExitStack() as holding, ExitStack() as calling:
        holder = holding.enter_context(gpu_held(web, token))
        started = time.monotonic()
        call = calling.enter_context(
            httpx.stream(
                "POST",
                f"{web.url}/v1/chat/completions",
                json=chat(stream=True),
                headers={"Authorization": f"Bearer {token}"},
                timeout=30,
            )
        )
        assert call.status_code == 200
        assert call.headers["content-type"] == "text/event-stream"
        lines = Lines(call, started)
        lines.read_comments(3)  # one at once, then every 0.3 s while the GPU is held
        job = Job.objects.get(pk=int(call.headers["x-gpusched-job-id"]))
        assert job.status == JobStatus.QUEUED
        holding.close()  # the holder hangs up: the GPU frees and the waiting call runs
        comments, data = lines.read_rest()
    first_comment = lines.comment_times[0]
    print(f"first comment {first_comment * 1000:.0f} ms after the call")
    assert first_comment < 1.0
    first = comments.decode().split("\n\n")[0] + "\n\n"
    shown = FIRST_COMMENT.match(first)
    assert shown is not None and int(shown.group(1)) == holder, first
    sent = simulator_sent(world, 2)
    assert data == sent["body"]  # llama-swap's lines, byte for byte
    assert ended(job.pk).status == JobStatus.SUCCEEDED
    assert Job.objects.get(pk=job.pk).result_body == sent["body"].decode()


def test_a_stream_granted_at_once_sends_no_comment(world, web, token):
    answer = httpx.post(
        f"{web.url}/v1/chat/completions",
        json=chat(stream=True),
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )
    assert answer.content == simulator_sent(world, 1)["body"]
    assert answer.headers["x-gpusched-score"] != ""  # the head came with the grant


def sent_chunks(sent: dict) -> list[dict]:
    events = sent["body"].decode().split("\n\n")
    return [json.loads(e.removeprefix("data: ")) for e in events if e.startswith("data: {")]


def test_the_openai_sdk_streams_the_same_chunks_whether_it_waited_or_not(world, web, token):
    client = client_for(web, token)
    at_once = [
        c.model_dump(exclude_unset=True)
        for c in client.chat.completions.create(**chat(stream=True))
    ]
    assert at_once == sent_chunks(simulator_sent(world, 1))
    with gpu_held(web, token):
        # Returns with the head, which the first comment brought: the call is queued.
        waited = client.chat.completions.create(**chat(stream=True))
        assert Job.objects.filter(status=JobStatus.QUEUED).count() == 1
    chunks = [c.model_dump(exclude_unset=True) for c in waited]
    assert chunks == sent_chunks(simulator_sent(world, 3))
    assert [c["object"] for c in chunks] == [c["object"] for c in at_once]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])


def test_an_upstream_error_after_the_first_comment_arrives_as_one_error_event(world, web, token):
    failing = chat(stream=True, sim={"status": 500})
    with ExitStack() as holding, ExitStack() as calling:
        holding.enter_context(gpu_held(web, token))
        call = calling.enter_context(
            httpx.stream(
                "POST",
                f"{web.url}/v1/chat/completions",
                json=failing,
                headers={"Authorization": f"Bearer {token}"},
                timeout=30,
            )
        )
        lines = Lines(call, time.monotonic())
        lines.read_comments(1)
        holding.close()
        comments, data = lines.read_rest()
    assert call.status_code == 200 and comments.startswith(b": queued")
    sent = simulator_sent(world, 2)
    assert sent["status"] == 500
    error = json.loads(sent["body"])["error"]
    assert data == b"data: " + json.dumps({"error": error}).encode() + b"\n\n"
    assert ended(int(call.headers["x-gpusched-job-id"])).status == JobStatus.FAILED

    client = client_for(web, token)
    with gpu_held(web, token):
        stream = client.chat.completions.create(  # back with the first comment
            **chat(stream=True), extra_body={"sim": {"status": 500}}
        )
    with pytest.raises(openai.APIError, match="simulated upstream error") as raised:
        list(stream)
    assert raised.value.body == error


def test_asked_for_reasoning_the_lines_come_as_reasoning_deltas_before_llama_swaps(
    world, web, token
):
    client = client_for(web, token)
    with gpu_held(web, token) as holder:
        stream = client.chat.completions.create(  # back with the first line
            **chat(stream=True), extra_headers={"X-Gpusched-Loading-State": "reasoning"}
        )
    chunks = [chunk.model_dump(exclude_unset=True) for chunk in stream]
    sent = sent_chunks(simulator_sent(world, 2))
    queued, answer = chunks[: -len(sent)], chunks[-len(sent) :]
    assert answer == sent
    assert queued and {chunk["object"] for chunk in queued} == {"chat.completion.chunk"}
    thinking = "".join(chunk["choices"][0]["delta"]["reasoning_content"] for chunk in queued)
    assert thinking.startswith("queued, position 1, estimated start in ")
    assert f"; gpu0 runs job {holder} (chat-a, " in thinking


def test_a_caller_that_hangs_up_after_comments_cancels_its_queued_job(world, web, token):
    with gpu_held(web, token):
        with httpx.stream(
            "POST",
            f"{web.url}/v1/chat/completions",
            json=chat(stream=True),
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
        ) as call:
            Lines(call, time.monotonic()).read_comments(1)
            job_id = int(call.headers["x-gpusched-job-id"])
        # Hung up while queued: the job is cancelled, never sent to llama-swap.
        wait_for(
            lambda: Job.objects.get(pk=job_id).status == JobStatus.CANCELLED,
            message="the abandoned stream's job to be cancelled",
        )
    assert len(world.simulator.log()) == 1  # the holder's request alone
