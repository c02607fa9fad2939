"""`manage.py restore PATH`: a backup into an empty database, brought up to date."""

from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, connection
from django.db.migrations.recorder import MigrationRecorder

from gpusched import pg_archive
from queueapp.dispatch.lease import jobs_recover_after_restore
from queueapp.models import JobStatus, Member
from queueapp.selectors import job_counts_by_status, jobs_reread


class Command(BaseCommand):
    help = (
        "Restore a backup written by `manage.py backup` into gpusched's database (the embedded"
        " one, or the one DATABASE_URL names), which must be empty unless --clean is given;"
        " then migrate it, and put the jobs that were running back in the queue to run again"
        " from the start. Stop gpusched's processes first."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("path", help="a backup file written by `manage.py backup`")
        parser.add_argument(
            "--clean",
            action="store_true",
            help="drop every table in the database first (its public schema): what it holds "
            "is lost",
        )
        parser.add_argument(
            "--pg-restore",
            default="",
            metavar="PATH",
            help="the pg_restore to run "
            "(default: GPUSCHED_PG_RESTORE, else the one pgserver ships)",
        )

    def handle(
        self, *args: object, path: str, clean: bool, pg_restore: str, **options: object
    ) -> None:
        source = Path(path).expanduser().resolve()
        if not source.is_file():
            raise CommandError(f"no backup file at {source}")
        where = pg_archive.database_description(connection.settings_dict)
        try:
            tool = pg_archive.tool_path(
                "pg_restore",
                given=pg_restore or settings.GPUSCHED_PG_RESTORE,
                variable="GPUSCHED_PG_RESTORE",
                option="--pg-restore",
            )
            tables = connection.introspection.table_names()
            if tables and not clean:
                raise CommandError(
                    f"{where} is not empty ({len(tables)} tables, e.g."
                    f" {', '.join(sorted(tables)[:3])}): restore into an empty database,"
                    " or pass --clean to drop what it holds first"
                )
            if tables:
                pg_archive.schema_empty()
            pg_archive.restore(tool=tool, database=connection.settings_dict, path=source)
            applied_before = len(MigrationRecorder(connection).applied_migrations())
            call_command("migrate", interactive=False, verbosity=0)
            applied = len(MigrationRecorder(connection).applied_migrations()) - applied_before
            recovered = jobs_reread(ids=jobs_recover_after_restore()).values()
            counts = job_counts_by_status(*JobStatus.values)
            members = Member.objects.count()
        except pg_archive.ArchiveError as exc:
            raise CommandError(f"{source} not restored into {where}: {exc}") from None
        except DatabaseError as exc:
            raise CommandError(f"cannot restore into {where}: {exc}") from None
        self.stdout.write(
            f"restored {source} into {where}: {members:,} members, "
            + ", ".join(f"{count:,} {status}" for status, count in counts.items())
            + f" jobs; {applied} migration(s) applied"
        )
        requeued = sorted(job.pk for job in recovered if job.status == JobStatus.QUEUED)
        failed = sorted(job.pk for job in recovered if job.status != JobStatus.QUEUED)
        self.stdout.write(
            f"jobs running at backup time: {len(requeued)} back in the queue to run again from"
            f" the start {requeued}, {len(failed)} failed (past max_attempts, or a front-door"
            f" caller's) {failed}"
        )
