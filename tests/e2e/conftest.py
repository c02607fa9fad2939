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
from queueapp.models import Tier
from queueapp.upstream.simulator import LlamaSwapSimulator
from tests import factories
from tests.e2e.helpers import (
    Scenario,
    World,
    case_on,
    e2e_simulator,
    shared_system,
    world_in_front_of,
)


@pytest.fixture
def simulator() -> Iterator[LlamaSwapSimulator]:
    sim = e2e_simulator()
    yield sim
    sim.stop()


@pytest.fixture
def world(transactional_db, simulator, tmp_path) -> Iterator[World]:
    """Tiers and policy as the fixtures define them, and the simulator; no cluster yet."""
    factories.schedules()  # the clusters' safety nets, as an install has them
    factories.policy()
    factories.tiers()
    with World(simulator, tmp_path) as world:
        yield world


@pytest.fixture(scope="module")
def shared(django_db_setup, django_db_blocker, tmp_path_factory) -> Iterator[Scenario]:
    """One GPU's simulator, its dispatcher cluster and a web server, started
    once for the module whose cases use `running` (helpers.shared_system)."""
    with shared_system(tmp_path_factory, django_db_blocker, web=True) as system:
        yield system


@pytest.fixture
def running(shared, transactional_db) -> Iterator[Scenario]:
    """A case on the module's shared system, with rows of its own (helpers.case_on)."""
    with case_on(shared) as case:
        yield case


@pytest.fixture
def batching(transactional_db, tmp_path) -> Iterator[World]:
    """The stack in front of a simulator that answers four chats at once
    (a batching server: chat parallel 4; image one at a time; 0.1 s a swap)."""
    simulator = LlamaSwapSimulator(
        models={"chat": 0.05, "image": 0.05}, parallel_models={"chat": 4}, swap_seconds=0.1
    ).start()
    with world_in_front_of(simulator, tmp_path) as world:
        yield world


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
