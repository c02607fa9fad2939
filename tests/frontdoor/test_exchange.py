"""The steps of a request to llama-swap outlive a hang-up: the call's task
is cancelled, the step under way is not, and what is left of the answer is
then drained or closed. No database: llama-swap is an httpx mock whose
answer arrives a chunk at a time, when the test lets it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest

from queueapp.frontdoor.exchange import UpstreamExchange

CHUNKS = [b"x" * 10, b"y" * 20, b"z" * 30]


class Answer(httpx.AsyncByteStream):
    """A body of CHUNKS, each sent once the test releases it."""

    def __init__(self) -> None:
        self.released = asyncio.Semaphore(0)
        self.sent = 0
        self.first_sent = asyncio.Event()
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in CHUNKS:
            await self.released.acquire()
            self.sent += 1
            self.first_sent.set()
            yield chunk

    async def aclose(self) -> None:
        self.closed = True


def exchange_with(answer: Answer) -> UpstreamExchange:
    client = httpx.AsyncClient(
        base_url="http://llama-swap",
        transport=httpx.MockTransport(lambda request: httpx.Response(200, stream=answer)),
    )
    return UpstreamExchange(client, client.build_request("POST", "/v1/images/generations"))


async def hung_up_while_reading(exchange: UpstreamExchange, answer: Answer) -> None:
    """The call reads the answer whole; its caller hangs up after the first chunk."""
    await exchange.send()
    call = asyncio.ensure_future(exchange.read())
    answer.released.release()
    await asyncio.wait_for(answer.first_sent.wait(), 5)  # until the first chunk is read
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert exchange.in_flight


@pytest.mark.asyncio
async def test_a_drain_reads_the_rest_of_an_answer_whose_caller_left_mid_read():
    answer = Answer()
    exchange = exchange_with(answer)
    await hung_up_while_reading(exchange, answer)
    draining = asyncio.ensure_future(exchange.drain())
    for _ in CHUNKS[1:]:
        answer.released.release()
    assert await draining == (200, sum(map(len, CHUNKS)))
    assert answer.sent == len(CHUNKS) and answer.closed
    assert not exchange.in_flight


@pytest.mark.asyncio
async def test_a_drain_reads_the_rest_of_a_stream_whose_caller_left_between_chunks():
    answer = Answer()
    exchange = exchange_with(answer)
    await exchange.send()
    answer.released.release()
    assert await exchange.next_chunk() == CHUNKS[0]
    # The caller hung up while its chunk was on its way to it: no step under way.
    assert exchange.in_flight
    draining = asyncio.ensure_future(exchange.drain())
    for _ in CHUNKS[1:]:
        answer.released.release()
    assert await draining == (200, sum(map(len, CHUNKS[1:])))
    assert answer.sent == len(CHUNKS)


@pytest.mark.asyncio
async def test_close_stops_the_read_under_way_and_closes_the_answer():
    answer = Answer()
    exchange = exchange_with(answer)
    await hung_up_while_reading(exchange, answer)
    await exchange.close()
    assert answer.closed and answer.sent == 1
    assert not exchange.in_flight


@pytest.mark.asyncio
async def test_nothing_is_in_flight_before_the_body_is_sent_or_after_a_refusal():
    answer = Answer()
    exchange = exchange_with(answer)
    assert not exchange.in_flight
    await exchange.send()
    assert exchange.in_flight
    await exchange.refused()
    assert not exchange.in_flight and answer.closed


def test_a_stream_has_ended_for_its_caller_once_it_gave_openais_last_event():
    """A caller that hangs up after `data: [DONE]` had its whole answer
    (relay._after_caller_left then ends the job as succeeded)."""
    exchange = UpstreamExchange(httpx.AsyncClient(), httpx.Request("POST", "http://sim/"))
    exchange.transcript.extend(b'data: {"choices": []}\n\n')
    assert not exchange.stream_ended
    exchange.transcript.extend(b"data: [DONE]\n\n")
    assert exchange.stream_ended
