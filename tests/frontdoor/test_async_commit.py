"""The front door's admission and end commit without the WAL flush wait,
for their own transaction only."""

from __future__ import annotations

import pytest
from django.db import connection, transaction

from queueapp.prepared import commit_without_flush_wait

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.database_server]


def synchronous_commit() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        return cursor.fetchone()[0]


def test_it_holds_for_its_transaction_only():
    with transaction.atomic():
        commit_without_flush_wait()
        assert synchronous_commit() == "off"
    assert synchronous_commit() == "on"


def test_the_setting_turns_it_off(settings):
    settings.GPUSCHED_FRONTDOOR_ASYNC_COMMIT = False
    with transaction.atomic():
        commit_without_flush_wait()
        assert synchronous_commit() == "on"
