"""One front-door request to llama-swap, in steps a hang-up does not cut.

A caller who hangs up cancels its call's task (queueapp/frontdoor/calls.py).
Were the request to llama-swap sent and read in that task, the cancel would
close it at once; that stops llama-server, but an image, audio or video
server renders on, and the GPU would be granted to the next job while the
render still runs. So each step of the exchange (sending the body, reading
the answer or its next chunk) runs as a task of its own that the call only
awaits: after a hang-up the step under way goes on, and the model's
`on_caller_gone` decides whether the exchange is closed (`close`) or read to
its end and discarded (`drain`) before the job ends and the GPU is freed.

Exchanges and `/v1/models` share one client per GPU's llama-swap and event
loop (`llama_swap_client`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine
from typing import Any, TypeVar

import httpx
from django.conf import settings

T = TypeVar("T")

_upstreams: dict[tuple[asyncio.AbstractEventLoop, str], httpx.AsyncClient] = {}


def llama_swap_client(url: str) -> httpx.AsyncClient:
    """One client per GPU's llama-swap and event loop: its connections are
    reused from call to call."""
    key = (asyncio.get_running_loop(), url)
    client = _upstreams.get(key)
    if client is None:
        client = httpx.AsyncClient(
            base_url=url, timeout=httpx.Timeout(settings.GPUSCHED_JOB_TIMEOUT, connect=5)
        )
        _upstreams[key] = client
    return client


class UpstreamExchange:
    """The request to one GPU's llama-swap and the reading of its answer."""

    def __init__(self, client: httpx.AsyncClient, request: httpx.Request) -> None:
        self.client = client
        self.request = request
        # The answer whose body is not read to its end yet, if any.
        self.response: httpx.Response | None = None
        self.status: int | None = None  # llama-swap's, once its answer's headers arrived
        # A stream given to the caller: its content type and every byte so far.
        self.stream_type = ""
        self.transcript = bytearray()
        self._step: asyncio.Future[Any] | None = None  # under way, or cut off by a hang-up
        self._chunks: AsyncIterator[bytes] | None = None

    async def _run(self, step: Coroutine[Any, Any, T]) -> T:
        task = asyncio.ensure_future(step)
        self._step = task
        try:
            result = await asyncio.shield(task)
        except asyncio.CancelledError:
            raise  # the caller hung up: the step stays, for `drain` or `close`
        except BaseException:
            self._step = None
            raise
        self._step = None
        return result

    async def send(self) -> httpx.Response:
        """Send the body; llama-swap's answer once its headers arrive."""

        async def sending() -> httpx.Response:
            response = await self.client.send(self.request, stream=True)
            self.response, self.status = response, response.status_code
            return response

        return await self._run(sending())

    async def refused(self) -> None:
        """The answer is a refusal to be retried (llama-swap's 429): closed and forgotten."""
        response, self.response, self.status = self.response, None, None
        if response is not None:
            await response.aclose()

    async def read(self) -> bytes:
        """The rest of the answer, whole."""
        response = self._response()

        async def reading() -> bytes:
            content = await response.aread()
            self.response = None
            return content

        return await self._run(reading())

    async def next_chunk(self) -> bytes | None:
        """The answer's next chunk as it arrives; None at its end."""
        response = self._response()
        if self._chunks is None:
            self._chunks = response.aiter_raw()
        chunks = self._chunks

        async def reading() -> bytes | None:
            try:
                return await anext(chunks)
            except StopAsyncIteration:
                self.response = None
                return None

        return await self._run(reading())

    def _response(self) -> httpx.Response:
        if self.response is None:
            raise RuntimeError("no answer of llama-swap is being read")
        return self.response

    @property
    def relayed(self) -> int:
        """Bytes of a stream given to the caller."""
        return len(self.transcript)

    @property
    def stream_ended(self) -> bool:
        """Whether the stream given to the caller has OpenAI's last event
        (`data: [DONE]`): a caller that then hangs up has its whole answer."""
        return self.transcript.rstrip().endswith(b"data: [DONE]")

    @property
    def in_flight(self) -> bool:
        """Whether llama-swap may still be working on the request: a step
        under way, or an answer not read to its end."""
        return (self._step is not None and not self._step.done()) or self.response is not None

    async def drain(self) -> tuple[int | None, int]:
        """Read what is left of the exchange and discard it: the step under
        way first, then the answer to its end. llama-swap's status (None
        when no answer came) and the bytes read here. Transport errors
        propagate; the answer is closed either way."""
        read = 0
        try:
            if self._step is not None:
                step, self._step = self._step, None
                result = await step
                if isinstance(result, bytes):
                    read += len(result)
            if self.response is not None:
                if self._chunks is None:
                    self._chunks = self.response.aiter_raw()
                async for chunk in self._chunks:
                    read += len(chunk)
            return self.status, read
        finally:
            await self.close()

    async def close(self) -> None:
        """Close the request to llama-swap wherever it is (llama-server stops
        generating when its connection closes)."""
        step, self._step = self._step, None
        if step is not None and not step.done():
            step.cancel()
        if step is not None:
            # Its outcome retrieved, whatever it was: nobody wants it any more.
            await asyncio.gather(step, return_exceptions=True)
        response, self.response = self.response, None
        if response is not None:
            await response.aclose()
