"""Real processes for end-to-end tests: the GPU cluster, the web server and the
simulator, started by the stack the benchmarks use too (gpusched/stack.py).

The tests run against the test database with committed transactions
(`transactional_db`), so the processes see what the test writes.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator

import pytest

from gpusched import embedded_db
from gpusched.stack import ROOT
from queueapp.models import DispatchDecision, Tier
from queueapp.upstream.simulator import LlamaSwapSimulator
from tests import factories
from tests.e2e.helpers import World, e2e_simulator, world_in_front_of


@pytest.fixture
def simulator() -> Iterator[LlamaSwapSimulator]:
    sim = e2e_simulator()
    yield sim
    sim.stop()


@pytest.fixture
def world(transactional_db, simulator, tmp_path) -> Iterator[World]:
    """Tiers and policy as the fixtures define them, and the simulator; no cluster yet."""
    factories.policy()
    factories.tiers()
    with World(simulator, tmp_path) as world:
        yield world


@pytest.fixture
def batching(transactional_db, tmp_path) -> Iterator[World]:
    """The stack in front of a simulator that answers four chats at once
    (a batching server: chat parallel 4; image one at a time; 0.1 s a swap)."""
    simulator = LlamaSwapSimulator(
        models={"chat": 0.05, "image": 0.05}, parallel_models={"chat": 4}, swap_seconds=0.1
    ).start()
    with world_in_front_of(simulator, tmp_path) as world:
        yield world


class Scenario:
    """The system of a DESIGN.md scenario: one GPU (the world's simulator),
    or two that both serve every model. On one GPU the dispatch order is the
    simulator's own log; on two, where jobs run side by side, it is the
    order of the dispatch decisions, checked against the simulators' logs."""

    def __init__(self, world, second: LlamaSwapSimulator | None) -> None:
        self.world = world
        self.sims = [world.simulator] + ([second] if second else [])
        self.simulator = world.simulator  # the one GPU's, or gpu0's
        self.decided_after = 0

    @property
    def upstreams(self) -> str:
        return ",".join(f"gpu{i}={sim.url}" for i, sim in enumerate(self.sims))

    def start_cluster(self) -> None:
        if len(self.sims) == 1:
            self.world.start_cluster()
            return
        for index in range(len(self.sims)):
            self.world.start_cluster(upstream_url=self.upstreams, GPUSCHED_GPU=f"gpu{index}")

    def log(self) -> list[dict]:
        return [entry for sim in self.sims for entry in sim.log()]

    def served(self) -> list[dict]:
        """Every simulator's successful requests, in arrival order."""
        entries = [e for sim in self.sims for e in sim.log() if e["status"] == 200]
        return sorted(entries, key=lambda e: e["received_at"])

    def served_labels(self) -> list[str]:
        """The jobs in the order they were dispatched."""
        if len(self.sims) == 1:
            return self.world.served_labels()
        labels = [
            decision.job.body["user"]
            for decision in DispatchDecision.objects.filter(pk__gt=self.decided_after)
            .select_related("job")
            .order_by("id")
        ]
        served = [e["body"]["user"] for e in self.served()]
        # Each job answered once, and only jobs that were dispatched (some may run still).
        assert len(served) == len(set(served)) and set(served) <= set(labels), (served, labels)
        return labels

    def reset_log(self) -> None:
        for sim in self.sims:
            sim.reset_log()
        self.decided_after = (
            DispatchDecision.objects.order_by("-id").values_list("id", flat=True).first() or 0
        )


@pytest.fixture(params=[1, 2], ids=["one-gpu", "two-gpus"])
def scenario(request, world) -> Iterator[Scenario]:
    second = e2e_simulator() if request.param == 2 else None
    if second is not None:
        # One member's jobs one at a time on two GPUs, as on one: every
        # tier's running limit strict (no GPU lent past it), so the order
        # observed is the score's.
        factories.tiers()
        Tier.objects.update(strict_running_limit=True)
    try:
        yield Scenario(world, second)
    finally:
        if second is not None:
            second.stop()


@pytest.fixture
def own_data_dir(monkeypatch):
    """A data folder for run_all's embedded PostgreSQL, as `make run` makes one
    under ./var/ (pytest's own temporary folders are private to the user, and
    as root PostgreSQL runs as pgserver's user)."""
    data_dir = ROOT / "var" / f"run-all-test-{uuid.uuid4().hex[:8]}"
    # For embedded_db.stop() below, should run_all have left its server running.
    monkeypatch.setenv("GPUSCHED_PGDATA", str(data_dir))
    yield data_dir
    embedded_db.stop()
    shutil.rmtree(data_dir, ignore_errors=True)
