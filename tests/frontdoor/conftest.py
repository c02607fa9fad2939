"""A live front-door gateway, as the claim sees one, for the tests here."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from queueapp import services
from queueapp.live.events import listener_connection_params
from queueapp.locks import DISPATCHER_LOCK_CLASS, GATEWAY_LOCK_CLASS

GATEWAY = 4242


@pytest.fixture
def gateway_session() -> Iterator[psycopg.Connection]:
    """A session holding gateway GATEWAY's liveness lock and listening on its
    channel: its jobs may be granted. It also holds the dispatcher lock of
    GPU gpu0, registered and seen reachable: a GPU the gateway may claim."""
    gpu = services.gpu_register(name="gpu0", url="http://127.0.0.1:9")
    services.gpu_state_record(gpu_id=gpu.pk, reachable=True, resident_model=None)
    with psycopg.connect(**listener_connection_params(), autocommit=True) as session:
        session.execute("SELECT pg_advisory_lock(%s, %s)", [DISPATCHER_LOCK_CLASS, gpu.pk])
        session.execute("SELECT pg_advisory_lock(%s, %s)", [GATEWAY_LOCK_CLASS, GATEWAY])
        session.execute(f"LISTEN gpusched_gateway_{GATEWAY}")
        yield session
