"""`manage.py lint_migrations`: every migration the previous release's
running processes can live with, or listed here with its reason.

An upgrade migrates while the previous release's web servers and
dispatchers still run (docs/operations/upgrades.md), so a migration must
not break their queries: no NOT NULL column without a database default, no
dropped or renamed column or table, no constraint their writes would break.
django-migration-linter reads each migration's SQL (`sqlmigrate`) and
names what is backward incompatible; `make lint` runs this command, which
fails on any such migration not in `ACCEPTED`. A new entry needs a reason
an operator can act on. The linter is a test dependency: production
installs do not carry it.
"""

from __future__ import annotations

import logging
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

APP = "queueapp"
# Why the previous release lives with each migration the linter flags.
BEFORE_FIRST_RELEASE = (
    "in 0.1.0, the first release: upgrades start from it, so no earlier release's "
    "processes run beside this migration"
)
ACCEPTED: dict[str, str] = {
    name: BEFORE_FIRST_RELEASE
    for name in (
        "0003_lanes_limits_run_stats",
        "0004_decisions_explained",
        "0005_public_dashboard",
        "0006_front_door",
        "0007_queue_open",
        "0015_gpus",
        "0017_model_parallel",
        "0020_work_conservation",
        "0021_model_on_caller_gone",
        "0022_job_wait_bound",
        "0023_priority_by_path",
        "0024_watchdog",
        "0026_job_path_fits_a_preload",
    )
}


class Command(BaseCommand):
    help = "Check that every migration is backward compatible, or accepted with its reason."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--database", default="default", help="the connection sqlmigrate renders for"
        )

    def handle(self, *args: Any, database: str, **options: Any) -> None:
        try:
            from django_migration_linter import MigrationLinter
        except ImportError:
            raise CommandError(
                "django-migration-linter is not installed: `pip install -e '.[test]'`"
            ) from None
        from django.db.migrations.loader import MigrationLoader

        # Its INFO lines (one per migration) would bury the verdicts.
        logging.getLogger("django_migration_linter").setLevel(logging.WARNING)

        names = {name for app, name in MigrationLoader(None).disk_migrations if app == APP}
        stale = sorted(set(ACCEPTED) - names)
        if stale:
            raise CommandError(f"accepted migrations that no longer exist: {', '.join(stale)}")
        linter = MigrationLinter(
            database=database,
            no_cache=True,
            only_applied_migrations=False,
            ignore_name=tuple(ACCEPTED),
            quiet={"ok", "ignore"},
        )
        linter.lint_all_migrations(app_label=APP)
        if linter.has_errors:
            raise CommandError(
                "a migration the previous release's running processes cannot live with "
                "(above); make it backward compatible (a database default, a separate "
                "release for a drop), or add it to ACCEPTED in "
                "queueapp/management/commands/lint_migrations.py with its reason"
            )
        self.stdout.write(
            f"{len(names)} migrations of {APP}: backward compatible, "
            f"{len(ACCEPTED)} accepted with their reason"
        )
