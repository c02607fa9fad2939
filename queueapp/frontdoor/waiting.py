"""A waiting stream shows life: SSE comment lines while its job is queued.

A streaming call (`"stream": true` on a chat or completion path) that has to
wait gets, within a second and then every GPUSCHED_STREAM_COMMENT_SECONDS, a
comment line such as

    : queued, position 3, estimated start in 42 s; gpu0 runs job 17 (image-xl, 12.4 s held)

A proxy with an idle timeout keeps the connection, a person sees why the
screen is still, and every SSE client (OpenAI's SDKs included) skips
comments, so the data lines that follow are llama-swap's, byte for byte. A
call granted within QUIET_SECONDS (an idle GPU's dispatcher claims in
milliseconds) sends none and answers exactly as it would without this
module. Once a line went out the head is 200
`text/event-stream`, and a later error arrives as an event
(queueapp/frontdoor/answers.py, `Reply`). A chat call may ask for the same
lines as `reasoning_content` deltas instead (`ReasoningLines`), which chat
UIs show as the model's thinking.

Why one board per process: each line needs the queue played forward
(queueapp/eta.py). One play per waiting stream and line would cost a
thousand plays a round with a thousand waiting streams; the board plays once
for every stream waiting here, and a stream asking again within
STATUS_FRESH_SECONDS reads that play. The play runs through the front
door's `db` (queueapp/frontdoor/gateway.py): no connection is held between
two lines.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from queueapp.eta import queue_forecast
from queueapp.frontdoor.answers import Headers, Reply
from queueapp.models import Job, JobStatus

T = TypeVar("T")

# The paths whose `"stream": true` answers are OpenAI's server-sent events.
COMMENTED_PATHS = ("/v1/chat/completions", "/v1/completions")
# A status this young is read from the last play, not played again.
STATUS_FRESH_SECONDS = 1.0
# A grant this soon after the call starts waiting (an idle GPU's dispatcher
# claiming) sends no comment: the answer is exactly the one without them.
QUIET_SECONDS = 0.3
# How long a line waits for its play before it goes out without the figures
# (the first must reach the caller within a second of the call).
STATUS_WAIT_SECONDS = 0.5
STREAM_HEAD: Headers = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache"),
    # nginx buffers a response unless told not to: the lines would wait there.
    (b"x-accel-buffering", b"no"),
]


def comments_while_queued(path: str, parsed: object) -> bool:
    """Whether a call's body asks for a stream that waiting comments suit."""
    return path in COMMENTED_PATHS and isinstance(parsed, dict) and parsed.get("stream") is True


# The request header that asks for the lines as reasoning instead of comments.
LOADING_STATE_HEADER = "x-gpusched-loading-state"
REASONING_PATH = "/v1/chat/completions"
Lines = Callable[[str], bytes]


def comment_line(text: str) -> bytes:
    """A line as an SSE comment, which every SSE client skips."""
    return f": {text}\n\n".encode()


@dataclass(frozen=True)
class ReasoningLines:
    """Lines as `reasoning_content` deltas of chat.completion.chunk objects,
    as llama-swap's `sendLoadingState` sends its loading progress: a chat
    UI shows them as the model's thinking. Asked for with
    `X-Gpusched-Loading-State: reasoning` on a chat call; they are data
    lines of gpusched's own before llama-swap's."""

    job_id: int
    model: str

    def __call__(self, text: str) -> bytes:
        chunk = {
            "id": f"gpusched-queue-{self.job_id}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": self.model,
            "choices": [
                {"index": 0, "delta": {"reasoning_content": f"{text}\n"}, "finish_reason": None}
            ],
        }
        return b"data: " + json.dumps(chunk).encode() + b"\n\n"


def lines_for(path: str, headers: Mapping[str, str], *, job_id: int, model: str) -> Lines:
    """How a waiting call's lines go out: comments, or reasoning deltas on a
    chat call whose LOADING_STATE_HEADER says `reasoning`."""
    asked = headers.get(LOADING_STATE_HEADER, "").strip().lower()
    if asked == "reasoning" and path == REASONING_PATH:
        return ReasoningLines(job_id=job_id, model=model)
    return comment_line


@dataclass(frozen=True)
class Holder:
    """A job running now, as a waiting caller sees it."""

    gpu: str
    job_id: int
    model: str
    held_seconds: float

    def text(self) -> str:
        where = self.gpu or "the GPU"
        return f"{where} runs job {self.job_id} ({self.model}, {self.held_seconds:.1f} s held)"


@dataclass(frozen=True)
class QueuedStatus:
    """Where a queued job stands: its place in the forecast (None: beyond
    `horizon` jobs), when it should start, and what runs now."""

    position: int | None
    starts_in: float | None
    horizon: int
    paused: bool
    holders: tuple[Holder, ...]
    # The start rests on a run of which nothing is known (eta.is_guess).
    guess: bool = False

    def text(self) -> str:
        if self.position is None:
            place = f"queued, more than {self.horizon} jobs ahead (no estimate that far)"
        else:
            place = f"queued, position {self.position}"
            if self.starts_in is not None:
                place += f", estimated start in {max(0, round(self.starts_in))} s"
                if self.guess:
                    place += " (a guess: a job ahead has no estimate yet)"
        running = ", ".join(holder.text() for holder in self.holders) or "nothing runs now"
        paused = "; dispatch is paused" if self.paused else ""
        return f"{place}; {running}{paused}"


def queued_statuses(job_ids: list[int]) -> dict[int, QueuedStatus]:
    """The status of those of `job_ids` still queued, from one play of the queue."""
    jobs = list(
        Job.objects.filter(pk__in=job_ids, status=JobStatus.QUEUED).only(
            "pk", "member_id", "priority", "model"
        )
    )
    if not jobs:
        return {}
    forecast = queue_forecast(include=jobs)
    running = (
        Job.objects.filter(status=JobStatus.RUNNING, started_at__isnull=False)
        .order_by("gpu__name", "id")
        .values_list("pk", "model", "gpu__name", "started_at")
    )
    holders = tuple(
        Holder(
            gpu=gpu or "",
            job_id=pk,
            model=model,
            held_seconds=max(0.0, (forecast.now - (started or forecast.now)).total_seconds()),
        )
        for pk, model, gpu, started in running
    )
    statuses = {}
    for job in jobs:
        place = forecast.for_job(job.pk)
        starts_in = (
            (forecast.start_of(place) - forecast.now).total_seconds() if place is not None else None
        )
        statuses[job.pk] = QueuedStatus(
            position=place.position if place is not None else None,
            starts_in=starts_in,
            horizon=len(forecast.order),
            paused=forecast.paused,
            holders=holders,
            guess=place is not None and forecast.is_guess(place),
        )
    return statuses


Play = Callable[[list[int]], Awaitable[dict[int, QueuedStatus]]]


class StatusBoard:
    """The statuses of one process's waiting streams, one play for all (see
    the module). `play` is `queued_statuses` run on the front door's threads."""

    def __init__(self, play: Play) -> None:
        self._play = play
        self._waiting: set[int] = set()  # every stream waiting here: each play covers them
        self._asking: dict[int, list[asyncio.Future[QueuedStatus | None]]] = {}
        self._known: dict[int, tuple[QueuedStatus | None, float]] = {}
        self._playing: asyncio.Task | None = None

    async def status(self, job_id: int) -> QueuedStatus | None:
        """Job `job_id`'s status (None: no longer queued), at most
        STATUS_FRESH_SECONDS old. Raises what the play raised."""
        self._waiting.add(job_id)
        known = self._known.get(job_id)
        if known is not None and time.monotonic() - known[1] < STATUS_FRESH_SECONDS:
            return known[0]
        future: asyncio.Future[QueuedStatus | None] = asyncio.get_running_loop().create_future()
        self._asking.setdefault(job_id, []).append(future)
        if self._playing is None or self._playing.done():
            self._playing = asyncio.get_running_loop().create_task(self._rounds())
        return await future

    def forget(self, job_id: int) -> None:
        """Job `job_id`'s stream waits no more."""
        self._waiting.discard(job_id)
        self._known.pop(job_id, None)

    async def _rounds(self) -> None:
        # Streams that ask while a play runs are answered by the next one.
        while self._asking:
            asking, self._asking = self._asking, {}
            played_at = time.monotonic()
            try:
                statuses = await self._play(sorted(self._waiting | set(asking)))
            except Exception as exc:
                for futures in asking.values():
                    for future in futures:
                        if not future.done():
                            future.set_exception(exc)
                continue
            for job_id in self._waiting:
                self._known[job_id] = (statuses.get(job_id), played_at)
            for job_id, futures in asking.items():
                for future in futures:
                    if not future.done():
                        future.set_result(statuses.get(job_id))


async def granted_while_commenting(
    waiting: asyncio.Future[T],
    *,
    reply: Reply,
    headers: Headers,
    job_id: int,
    board: StatusBoard,
    interval: float,
    lines: Lines = comment_line,
) -> T:
    """What `waiting` resolves to; until then comment lines, the first
    between QUIET_SECONDS and STATUS_WAIT_SECONDS after the call began to
    wait, the next at most `interval` seconds after the one before; the
    head (200 `text/event-stream` and `headers`) goes out with the first.
    None is sent when `waiting` resolves before the first is due. `lines`
    renders a line's text (comments unless the caller asked otherwise)."""
    loop = asyncio.get_running_loop()
    quiet_until = loop.time() + QUIET_SECONDS
    send_by = loop.time() + STATUS_WAIT_SECONDS
    try:
        while True:
            # Asked STATUS_WAIT_SECONDS ahead: the line goes out by `send_by`,
            # with the figures or without them.
            await _until(send_by - STATUS_WAIT_SECONDS, waiting)
            if waiting.done():
                break
            asking = asyncio.ensure_future(board.status(job_id))
            either: set[asyncio.Future[Any]] = {waiting, asking}
            try:
                await asyncio.wait(
                    either,
                    timeout=max(0.0, send_by - loop.time()),
                    return_when=asyncio.FIRST_COMPLETED,
                )
            finally:
                late = not asking.done()
                if late:
                    asking.cancel()
            text = "queued (the estimate is late)" if late else _line(asking)
            await _until(quiet_until, waiting)
            if waiting.done():
                break
            if text is not None:
                await reply.start(200, [*STREAM_HEAD, *headers])
                await reply.body(lines(text))
            send_by = loop.time() + interval
    finally:
        board.forget(job_id)
    return await waiting


async def _until(moment: float, waiting: asyncio.Future[Any]) -> None:
    """Until the loop's clock reads `moment`, or `waiting` resolves."""
    left = moment - asyncio.get_running_loop().time()
    if left > 0 and not waiting.done():
        await asyncio.wait({waiting}, timeout=left)


def _line(asking: asyncio.Future[QueuedStatus | None]) -> str | None:
    """The comment's text; None when the job is no longer queued (its grant
    is on its way): nothing is sent."""
    if asking.exception() is not None:
        return "queued (no estimate now)"
    status = asking.result()
    return status.text() if status is not None else None
