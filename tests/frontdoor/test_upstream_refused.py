"""How a granted call treats a llama-swap that refuses connections (a few
tries, then UpstreamUnreachable: the job goes back to the queue) and one
that is busy (429: wait for Retry-After, as long as it takes). No database:
the upstream is an httpx mock."""

from __future__ import annotations

import httpx
import pytest

from queueapp.frontdoor import relay
from queueapp.frontdoor.exchange import UpstreamExchange
from queueapp.upstream.client import UpstreamUnreachable


@pytest.fixture(autouse=True)
def no_pause(monkeypatch) -> None:
    monkeypatch.setattr(relay, "UPSTREAM_RETRY_SECONDS", 0.0)


def upstream_answering(*answers: int) -> tuple[httpx.AsyncClient, list[int]]:
    """A client whose llama-swap answers each request with the next of
    `answers`: a status, or 0 for a refused connection; and the list of
    what it did, one entry a request."""
    seen: list[int] = []

    def handle(request: httpx.Request) -> httpx.Response:
        answer = answers[len(seen)]
        seen.append(answer)
        if answer == 0:
            raise httpx.ConnectError("connection refused", request=request)
        return httpx.Response(answer, headers={"Retry-After": "0"}, json={})

    client = httpx.AsyncClient(base_url="http://llama-swap", transport=httpx.MockTransport(handle))
    return client, seen


def chat(client: httpx.AsyncClient) -> httpx.Request:
    return client.build_request("POST", "/v1/chat/completions", json={"model": "chat"})


@pytest.mark.asyncio
async def test_a_llama_swap_that_refuses_every_connection_is_given_up_after_the_budget():
    client, seen = upstream_answering(*[0] * (relay.UPSTREAM_CONNECT_TRIES + 5))

    with pytest.raises(UpstreamUnreachable, match="connections to llama-swap failed"):
        await relay.send_upstream(UpstreamExchange(client, chat(client)))

    assert len(seen) == relay.UPSTREAM_CONNECT_TRIES


@pytest.mark.asyncio
async def test_a_llama_swap_back_within_the_budget_answers_the_call():
    client, seen = upstream_answering(*[0] * (relay.UPSTREAM_CONNECT_TRIES - 1), 200)

    response = await relay.send_upstream(UpstreamExchange(client, chat(client)))

    assert response.status_code == 200 and seen[-1] == 200


@pytest.mark.asyncio
async def test_a_busy_llama_swap_is_waited_for_and_counts_no_refusal():
    refusals = [0] * (relay.UPSTREAM_CONNECT_TRIES - 1)
    client, seen = upstream_answering(*refusals, 429, 429, *refusals, 429, 200)

    response = await relay.send_upstream(UpstreamExchange(client, chat(client)))

    assert response.status_code == 200
    assert len(seen) == 2 * len(refusals) + 4
