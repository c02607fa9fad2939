"""`manage.py backup` and `manage.py restore` against the real server: a
backup of a live queue restored into a new database keeps every job, and
the jobs that were running go back to the queue to run again."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from psycopg import sql
from psycopg.rows import dict_row

from queueapp import services
from queueapp.dispatch.claim import job_claim_next
from queueapp.models import Job, JobStatus
from tests import factories
from tests.database import database_url

pytestmark = pytest.mark.database_server

ROOT = Path(__file__).resolve().parent.parent
# Columns that say where a job stands in the queue and what it will send.
QUEUE_COLUMNS = "id, status, body, priority, rank_key, is_lane_head, submitted_at, attempts"


@pytest.fixture
def empty_database() -> Iterator[str]:
    """A new, empty database beside the test database (its DATABASE_URL),
    dropped after the test."""
    name = f"{connection.settings_dict['NAME']}_restored"
    statements = [
        sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)),
        sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)),
    ]
    with psycopg.connect(database_url(), dbname="postgres", autocommit=True) as admin:
        for statement in statements:
            admin.execute(statement)
    yield database_url().rsplit("/", 1)[0] + f"/{name}"
    with psycopg.connect(database_url(), dbname="postgres", autocommit=True) as admin:
        admin.execute(statements[0])


def queue_rows(url: str) -> dict[int, dict[str, Any]]:
    with psycopg.connect(url, row_factory=dict_row) as session:
        rows = session.execute(f"SELECT {QUEUE_COLUMNS} FROM queueapp_job").fetchall()
    return {row["id"]: row for row in rows}


def manage(*args: str, database: str) -> subprocess.CompletedProcess[str]:
    """`manage.py` in a process of its own, on `database`."""
    env = {**os.environ, "DATABASE_URL": database}
    env.pop("GPUSCHED_TEST_DATABASE", None)
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.e2e  # starts a process
@pytest.mark.django_db(transaction=True)
def test_a_restored_backup_keeps_the_queue_and_runs_the_running_job_again(
    default_tiers, empty_database, tmp_path
):
    ann, _ = factories.member("ann")
    bob, _ = factories.member("bob", "pro")
    render = factories.job(ann, label="render")
    running = job_claim_next(resident_model=None, worker="test")
    assert running.job_id == render.pk  # its lease runs well past the restore
    after_render = factories.job(ann, label="after the render")
    bob_jobs = [
        factories.job(bob, priority=priority, label=f"bob {priority}")
        for priority in ("batch", "normal", "batch")
    ]
    cancelled = services.job_cancel(job=factories.job(bob, label="gone"), by="test")
    before = queue_rows(database_url())

    out = io.StringIO()
    backup = tmp_path / "gpusched.dump"
    call_command("backup", str(backup), stdout=out)
    assert "4 jobs queued and 1 running in it" in out.getvalue()
    restored = manage("restore", str(backup), database=empty_database)
    assert restored.returncode == 0, restored.stderr
    assert f"1 back in the queue to run again from the start [{render.pk}]" in restored.stdout

    after = queue_rows(empty_database)
    assert after.keys() == before.keys()  # nothing lost, nothing added
    for job in bob_jobs:  # a line nothing ran from: exactly as it was
        assert after[job.pk] == before[job.pk]
    assert after[cancelled.pk]["status"] == JobStatus.CANCELLED
    assert after[after_render.pk]["body"] == before[after_render.pk]["body"]
    # The render is at its old place again, ahead of the job behind it in its
    # line, and its start counts as an attempt (max_attempts applies).
    assert before[render.pk]["status"] == JobStatus.RUNNING
    assert after[render.pk] == {
        **before[render.pk],
        "status": JobStatus.QUEUED,
        "is_lane_head": True,
    }
    assert before[after_render.pk]["is_lane_head"] and not after[after_render.pk]["is_lane_head"]
    with psycopg.connect(empty_database) as session:
        events = session.execute(
            "SELECT kind, detail->>'reason' FROM queueapp_jobevent WHERE job_id = %s ORDER BY id",
            [render.pk],
        ).fetchall()
    assert events[-1] == ("requeued", "restored from a backup")


@pytest.mark.django_db
def test_restore_refuses_a_database_that_holds_tables(default_tiers, tmp_path):
    factories.job(factories.member("ann")[0])
    backup = tmp_path / "gpusched.dump"
    backup.write_bytes(b"PGDMP")
    with pytest.raises(CommandError, match=r"is not empty \(\d+ tables.*pass --clean"):
        call_command("restore", str(backup))
    assert Job.objects.count() == 1


@pytest.mark.django_db
def test_backup_and_restore_name_what_is_wrong_without_a_traceback(tmp_path):
    with pytest.raises(CommandError, match="the folder .*missing does not exist"):
        call_command("backup", str(tmp_path / "missing" / "gpusched.dump"))
    with pytest.raises(CommandError, match="no backup file at"):
        call_command("restore", str(tmp_path / "nothing.dump"))
    with pytest.raises(CommandError, match="--pg-dump / GPUSCHED_PG_DUMP pg_dump is not an"):
        call_command("backup", str(tmp_path / "a.dump"), "--pg-dump", str(tmp_path / "none"))


@pytest.mark.e2e  # starts a process
@pytest.mark.django_db(transaction=True)
def test_backup_refuses_a_pg_dump_older_than_the_server(tmp_path):
    old = tmp_path / "pg_dump"
    old.write_text("#!/bin/sh\necho 'pg_dump (PostgreSQL) 9.6.24'\n")
    old.chmod(0o755)
    with pytest.raises(CommandError, match=r"pg_dump 9, older than the server \(PostgreSQL 1\d"):
        call_command("backup", str(tmp_path / "a.dump"), "--pg-dump", str(old))
    assert not (tmp_path / "a.dump").exists()
