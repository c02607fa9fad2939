"""`manage.py backup PATH`: a consistent pg_dump of gpusched's database."""

from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, connection, transaction

from gpusched import pg_archive
from queueapp.models import JobStatus
from queueapp.selectors import job_counts_by_status


class Command(BaseCommand):
    help = (
        "Write a backup of gpusched's database (pg_dump's custom format) to PATH: the embedded"
        " database, or the server DATABASE_URL names. It is one consistent snapshot, taken"
        " while gpusched runs; `manage.py restore PATH` brings it back."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("path", help="the file to write (replaced when it exists)")
        parser.add_argument(
            "--pg-dump",
            default="",
            metavar="PATH",
            help="the pg_dump to run, at least the server's major version "
            "(default: GPUSCHED_PG_DUMP, else the one pgserver ships)",
        )

    def handle(self, *args: object, path: str, pg_dump: str, **options: object) -> None:
        target = Path(path).expanduser().resolve()
        if target.is_dir():
            raise CommandError(f"{target} is a folder; give the backup file's path")
        if not target.parent.is_dir():
            raise CommandError(f"cannot write {target}: the folder {target.parent} does not exist")
        try:
            tool = pg_archive.tool_path(
                "pg_dump",
                given=pg_dump or settings.GPUSCHED_PG_DUMP,
                variable="GPUSCHED_PG_DUMP",
                option="--pg-dump",
            )
            connection.ensure_connection()  # nothing may run before the snapshot's transaction
            with transaction.atomic(durable=True):
                snapshot = pg_archive.snapshot_export()
                counts = job_counts_by_status(JobStatus.QUEUED, JobStatus.RUNNING)
                size = pg_archive.dump(
                    tool=tool, database=connection.settings_dict, path=target, snapshot=snapshot
                )
        except pg_archive.ArchiveError as exc:
            raise CommandError(str(exc)) from None
        except DatabaseError as exc:
            raise CommandError(f"cannot reach gpusched's database: {exc}") from None
        where = pg_archive.database_description(connection.settings_dict)
        self.stdout.write(
            f"wrote {target} ({size / 1024 / 1024:.1f} MiB, {size:,} bytes) from {where}:"
            f" {counts[JobStatus.QUEUED]:,} jobs queued and {counts[JobStatus.RUNNING]:,}"
            " running in it"
        )
