"""The parts of a waiting stream, one function at a time: the comment's
text, the loop that sends comments until the grant, the board that plays
the queue once for every waiting stream, and an answer that arrives after
the stream's head. No database: the board's play is a stand-in.
(tests/e2e/test_front_door_waiting_stream.py runs the whole of it.)"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable
from typing import Any

import pytest

from queueapp.frontdoor import waiting
from queueapp.frontdoor.answers import Answer, Reply
from queueapp.frontdoor.waiting import (
    Holder,
    QueuedStatus,
    StatusBoard,
    comment_line,
    comments_while_queued,
    granted_while_commenting,
    lines_for,
)


@pytest.fixture(autouse=True)
def no_quiet_time(monkeypatch) -> None:
    monkeypatch.setattr(waiting, "QUIET_SECONDS", 0.0)


HOLDER = Holder(gpu="gpu0", job_id=17, model="image-xl", held_seconds=12.44)
STATUS = QueuedStatus(position=3, starts_in=41.6, horizon=300, paused=False, holders=(HOLDER,))


def test_a_comment_gives_the_position_the_estimated_start_and_what_runs():
    assert STATUS.text() == (
        "queued, position 3, estimated start in 42 s; gpu0 runs job 17 (image-xl, 12.4 s held)"
    )


def test_a_comment_says_when_the_job_is_beyond_the_forecast_nothing_runs_or_dispatch_is_paused():
    beyond = QueuedStatus(position=None, starts_in=None, horizon=300, paused=True, holders=())
    assert beyond.text() == (
        "queued, more than 300 jobs ahead (no estimate that far); nothing runs now; "
        "dispatch is paused"
    )


def test_only_streaming_chat_and_completion_calls_get_comments():
    assert comments_while_queued("/v1/chat/completions", {"stream": True})
    assert comments_while_queued("/v1/completions", {"stream": True})
    assert not comments_while_queued("/v1/chat/completions", {"stream": False})
    assert not comments_while_queued("/v1/chat/completions", {"stream": "yes"})
    assert not comments_while_queued("/v1/embeddings", {"stream": True})
    assert not comments_while_queued("/v1/chat/completions", None)


def event_of(answer: Answer) -> dict[str, Any]:
    event = answer.as_event()
    assert event.startswith(b"data: ") and event.endswith(b"\n\n") and event.count(b"\n") == 2
    return json.loads(event.removeprefix(b"data: "))


def test_a_front_door_error_becomes_one_event_with_its_openai_error_object():
    answer = Answer.error(503, "gpu0 is busy", "server_error", "gpu_busy", Retry_After="9")
    assert event_of(answer) == json.loads(answer.body)
    assert event_of(answer)["error"]["code"] == "gpu_busy"


def test_llama_swaps_error_envelope_becomes_its_error_object_alone():
    error = {"message": "boom", "type": "server_error", "param": None, "code": "internal_error"}
    envelope = json.dumps({"src": "llama-swap", "error": error}).encode()
    assert event_of(Answer(500, envelope, "application/json")) == {"error": error}


def test_an_error_without_openai_shape_gets_an_error_object_made_from_its_text():
    assert event_of(Answer(502, b"bad gateway\n", "text/plain")) == {
        "error": {
            "message": "bad gateway",
            "type": "server_error",
            "param": None,
            "code": "http_502",
        }
    }
    assert event_of(Answer(404, b'{"error": "no model"}', "application/json"))["error"] == {
        "message": "no model",
        "type": "invalid_request_error",
        "param": None,
        "code": "http_404",
    }


def test_a_success_answer_after_the_head_is_relayed_as_the_events_data():
    assert Answer(200, b'{"a": 1}\n{"b": 2}', "application/json").as_event() == (
        b'data: {"a": 1}\ndata: {"b": 2}\n\n'
    )


class Caller:
    """An ASGI `send` that records what the caller receives."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.comment_sent = asyncio.Event()

    async def __call__(self, message: dict[str, Any]) -> None:
        self.messages.append(message)
        if message.get("body", b"").startswith(b": "):
            self.comment_sent.set()

    @property
    def comments(self) -> list[bytes]:
        return [m["body"] for m in self.messages if m.get("body", b"").startswith(b": ")]


@pytest.mark.asyncio
async def test_reply_sends_a_whole_answer_before_the_head_and_an_event_after_it():
    before = Caller()
    await Reply(before).answer(Answer.error(409, "cancelled", "invalid_request_error"))
    assert [m["type"] for m in before.messages] == ["http.response.start", "http.response.body"]
    assert before.messages[0]["status"] == 409

    after = Caller()
    reply = Reply(after)
    await reply.start(200, [])
    await reply.start(500, [])  # the head went out: nothing more
    await reply.answer(Answer.error(409, "cancelled", "invalid_request_error"))
    assert [m.get("status") for m in after.messages] == [200, None]
    assert after.messages[-1]["more_body"] is False
    assert event_of(Answer.error(409, "cancelled", "invalid_request_error")) == json.loads(
        after.messages[-1]["body"].removeprefix(b"data: ")
    )


class Board(StatusBoard):
    """A board whose play answers `STATUS` for every job it is asked about
    (or raises `failure`), counting its plays."""

    def __init__(self, failure: Exception | None = None) -> None:
        super().__init__(self.play_queue)
        self.plays: list[list[int]] = []
        self.failure = failure
        self.release = asyncio.Event()
        self.release.set()
        self.playing = asyncio.Event()  # a play has started
        self.asked: dict[int, asyncio.Event] = {}  # a stream has asked for this job

    async def status(self, job_id: int) -> QueuedStatus | None:
        # Set before the board registers the question: the test, woken,
        # finds it registered (nothing runs between the two).
        self.asked.setdefault(job_id, asyncio.Event()).set()
        return await super().status(job_id)

    async def play_queue(self, job_ids: list[int]) -> dict[int, QueuedStatus]:
        self.plays.append(job_ids)
        self.playing.set()
        await self.release.wait()
        if self.failure is not None:
            raise self.failure
        return dict.fromkeys(job_ids, STATUS)

    async def settled(self) -> None:
        """Every play let go and ended (none left pending after the test)."""
        self.release.set()
        if self._playing is not None:
            await self._playing


async def within(waiting: Awaitable[object], seconds: float = 5.0) -> object:
    """`waiting`, with a deadline: a state the test waits for, never a fixed sleep."""
    return await asyncio.wait_for(waiting, seconds)


async def asked(board: Board, job_id: int) -> None:
    """Until a stream has asked `board` for `job_id`."""
    await board.asked.setdefault(job_id, asyncio.Event()).wait()


async def commenting(
    caller: Caller, board: StatusBoard, granted: asyncio.Future[str], interval: float = 0.01
) -> str:
    return await granted_while_commenting(
        granted,
        reply=Reply(caller),
        headers=[(b"x-gpusched-job-id", b"5")],
        job_id=5,
        board=board,
        interval=interval,
    )


async def comments_until(caller: Caller, count: int) -> None:
    while len(caller.comments) < count:
        caller.comment_sent.clear()
        await asyncio.wait_for(caller.comment_sent.wait(), timeout=5)


@pytest.mark.asyncio
async def test_a_call_granted_before_it_waits_sends_nothing():
    caller, board = Caller(), Board()
    granted = asyncio.get_running_loop().create_future()
    granted.set_result("grant")
    assert await commenting(caller, board, granted) == "grant"
    assert caller.messages == [] and board.plays == []


@pytest.mark.asyncio
async def test_a_waiting_call_gets_the_head_and_a_comment_each_interval_until_its_grant():
    caller, board = Caller(), Board()
    granted = asyncio.get_running_loop().create_future()
    waiting_call = asyncio.ensure_future(commenting(caller, board, granted))
    await comments_until(caller, 3)
    granted.set_result("grant")
    assert await waiting_call == "grant"
    head, *rest = caller.messages
    assert head["status"] == 200
    assert (b"content-type", b"text/event-stream") in head["headers"]
    assert (b"x-gpusched-job-id", b"5") in head["headers"]
    assert {m["body"] for m in rest} == {f": {STATUS.text()}\n\n".encode()}
    assert all(m["more_body"] for m in rest)


@pytest.mark.asyncio
async def test_a_grant_that_comes_while_the_first_comment_is_computed_sends_nothing():
    caller, board = Caller(), Board()
    board.release.clear()
    granted = asyncio.get_running_loop().create_future()
    waiting_call = asyncio.ensure_future(commenting(caller, board, granted))
    await within(board.playing.wait())  # until the play has started
    granted.set_result("grant")
    assert await waiting_call == "grant"
    assert caller.messages == []
    await board.settled()


@pytest.mark.asyncio
async def test_a_grant_within_the_quiet_time_sends_nothing_even_with_the_status_ready(monkeypatch):
    monkeypatch.setattr(waiting, "QUIET_SECONDS", 30.0)
    caller, board = Caller(), Board()
    granted = asyncio.get_running_loop().create_future()
    waiting_call = asyncio.ensure_future(commenting(caller, board, granted))
    await within(board.playing.wait())  # until the play has started
    await board.settled()
    await asyncio.wait({waiting_call}, timeout=0.05)  # the status is read: a comment is due
    granted.set_result("grant")
    assert await waiting_call == "grant"
    assert caller.messages == []


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("failure", "late", "comment"),
    [
        (RuntimeError("database away"), False, b": queued (no estimate now)\n\n"),
        (None, True, b": queued (the estimate is late)\n\n"),
    ],
    ids=["failing", "late"],
)
async def test_a_failing_or_late_play_still_sends_a_comment(monkeypatch, failure, late, comment):
    monkeypatch.setattr(waiting, "STATUS_WAIT_SECONDS", 0.01)
    caller, board = Caller(), Board(failure=failure)
    if late:
        board.release.clear()
    granted = asyncio.get_running_loop().create_future()
    waiting_call = asyncio.ensure_future(commenting(caller, board, granted))
    await comments_until(caller, 1)
    granted.set_result("grant")
    await waiting_call
    assert caller.comments[0] == comment
    await board.settled()


@pytest.mark.asyncio
async def test_the_board_plays_once_for_every_stream_that_asks_meanwhile_and_reuses_a_fresh_play():
    board = Board()
    board.release.clear()
    first = asyncio.ensure_future(board.status(1))
    await within(board.playing.wait())
    # Asked while the first play runs: answered by one more play, together.
    others = [asyncio.ensure_future(board.status(job)) for job in (2, 3)]
    for job in (2, 3):
        await within(asked(board, job))
    board.release.set()
    assert await asyncio.gather(first, *others) == [STATUS] * 3
    assert board.plays == [[1], [1, 2, 3]]
    assert await board.status(2) == STATUS  # fresh: no play
    assert len(board.plays) == 2
    board.forget(2)
    assert await board.status(2) == STATUS
    assert board.plays[-1] == [1, 2, 3]


def test_a_chat_call_may_ask_for_its_lines_as_reasoning_deltas():
    headers = {"x-gpusched-loading-state": " Reasoning "}
    lines = lines_for("/v1/chat/completions", headers, job_id=5, model="chat-a")
    event = lines("queued, position 2")
    assert event.startswith(b"data: ") and event.endswith(b"\n\n")
    chunk = json.loads(event.removeprefix(b"data: "))
    assert chunk["id"] == "gpusched-queue-5" and chunk["model"] == "chat-a"
    assert chunk["object"] == "chat.completion.chunk"
    assert chunk["choices"] == [
        {"index": 0, "delta": {"reasoning_content": "queued, position 2\n"}, "finish_reason": None}
    ]
    # Completions have no reasoning; other values and no header: comments.
    assert lines_for("/v1/completions", headers, job_id=5, model="m") is comment_line
    assert lines_for("/v1/chat/completions", {}, job_id=5, model="m") is comment_line
    other = {"x-gpusched-loading-state": "content"}
    assert lines_for("/v1/chat/completions", other, job_id=5, model="m") is comment_line
    assert comment_line("queued") == b": queued\n\n"
