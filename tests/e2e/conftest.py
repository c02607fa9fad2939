"""Real processes for end-to-end tests: the GPU cluster, the web server and the
simulator, started by the stack the benchmarks use too (gpusched/stack.py).

The tests run against the test database with committed transactions
(`transactional_db`), so the processes see what the test writes.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpusched.stack import Stack
from queueapp.upstream.simulator import LlamaSwapSimulator
from tests import factories
from tests.database import database_url


@pytest.fixture
def simulator() -> Iterator[LlamaSwapSimulator]:
    sim = LlamaSwapSimulator(
        models={"chat-a": 0.05, "chat-b": 0.05},
        default_seconds=0.05,
        accept_any_model=True,
        swap_seconds=0.1,
    ).start()
    yield sim
    sim.stop()


class World(Stack):
    """The stack on the test database, in front of the in-process simulator
    (whose log the tests read); every process it started is stopped at teardown."""

    def __init__(self, simulator: LlamaSwapSimulator, log_dir: Path) -> None:
        super().__init__(
            database_url=database_url(),
            log_dir=log_dir,
            upstream_url=simulator.url,
            media_root=log_dir / "media",
            access_log=True,
        )
        self.simulator = simulator

    def served(self) -> list[dict]:
        """The simulator's successful requests in arrival order."""
        return [entry for entry in self.simulator.log() if entry["status"] == 200]

    def served_labels(self) -> list[str]:
        return [entry["body"]["user"] for entry in self.served()]


@pytest.fixture
def world(transactional_db, simulator, tmp_path) -> Iterator[World]:
    """Tiers and policy as the fixtures define them, and the simulator; no cluster yet."""
    factories.policy()
    factories.tiers()
    with World(simulator, tmp_path) as world:
        yield world
