"""Simulators started over real HTTP for the tests here, stopped after each."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from queueapp.upstream.simulator import LlamaSwapSimulator
from tests.upstream.helpers import EventStream


@pytest.fixture
def make_sim() -> Iterator[Callable[..., LlamaSwapSimulator]]:
    started: list[LlamaSwapSimulator] = []

    def factory(**kwargs: Any) -> LlamaSwapSimulator:
        kwargs.setdefault("models", {"chat": 0.05, "image": 0.05})
        kwargs.setdefault("swap_seconds", 0.1)
        sim = LlamaSwapSimulator("127.0.0.1", 0, **kwargs).start()
        started.append(sim)
        return sim

    yield factory
    for sim in started:
        sim.stop()


@pytest.fixture
def sim(make_sim: Callable[..., LlamaSwapSimulator]) -> LlamaSwapSimulator:
    """A simulator with the defaults of `make_sim`."""
    return make_sim()


@pytest.fixture
def client(sim: LlamaSwapSimulator) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=sim.url, timeout=10) as c:
        yield c


@pytest.fixture
def open_events() -> Iterator[Callable[[LlamaSwapSimulator], EventStream]]:
    opened: list[EventStream] = []

    def factory(sim: LlamaSwapSimulator) -> EventStream:
        stream = EventStream(sim.url)
        opened.append(stream)
        return stream

    yield factory
    for stream in opened:
        stream.close()
