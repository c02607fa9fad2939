"""The dispatch tests' fixtures."""

from collections.abc import Iterator

import psycopg
import pytest

from queueapp.live.events import listener_connection_params


@pytest.fixture
def lock_session() -> Iterator[psycopg.Connection]:
    """A session that holds the GPUs' dispatcher locks, as their passes do
    (a GPU whose dispatcher lives claims; the forecast plays it)."""
    with psycopg.connect(**listener_connection_params(), autocommit=True) as session:
        yield session
        session.execute("SELECT pg_advisory_unlock_all()")
