"""`manage.py prune_jobs`: remove finished jobs past the retention period."""

from __future__ import annotations

import argparse
import re
import time
from datetime import timedelta

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from queueapp import retention
from queueapp.selectors import db_now

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
AGE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", re.IGNORECASE)


def parse_age(text: str) -> timedelta:
    """`30d`, `12h`, `90m`, `45s`, `2w` (also `1.5d`) as a timedelta."""
    match = AGE.fullmatch(text)
    if match is None:
        raise argparse.ArgumentTypeError(
            f"expected a number and a unit (s, m, h, d or w), e.g. 30d or 12h; got {text!r}"
        )
    return timedelta(seconds=float(match[1]) * UNITS[match[2].lower()])


def describe_age(age: timedelta) -> str:
    seconds = age.total_seconds()
    for unit in ("w", "d", "h", "m"):
        if seconds >= UNITS[unit] and seconds % UNITS[unit] == 0:
            return f"{seconds / UNITS[unit]:g}{unit}"
    return f"{seconds:g}s"


class Command(BaseCommand):
    help = (
        "Delete finished jobs (succeeded, failed, cancelled) that ended before the retention"
        " period, with their events, dispatch decisions and webhook deliveries, in short"
        " batches. Queued and running jobs are never touched."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than",
            type=parse_age,
            help="how long ago a job must have finished, e.g. 30d, 12h, 90m "
            "(default: GPUSCHED_RETENTION_DAYS, 30 days)",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="count what would be deleted; delete nothing"
        )
        parser.add_argument(
            "--batch-size",
            type=int,
            default=retention.PRUNE_BATCH_SIZE,
            help=f"jobs per transaction (default {retention.PRUNE_BATCH_SIZE})",
        )

    def handle(
        self,
        *args: object,
        older_than: timedelta | None,
        dry_run: bool,
        batch_size: int,
        **options: object,
    ) -> None:
        if older_than is None:
            days = settings.GPUSCHED_RETENTION_DAYS
            if days <= 0:
                raise CommandError(
                    "GPUSCHED_RETENTION_DAYS is 0 (pruning off); pass --older-than, e.g. 30d"
                )
            older_than = timedelta(days=days)
        if batch_size < 1:
            raise CommandError(f"--batch-size must be at least 1, got {batch_size}")
        cutoff = db_now() - older_than
        start = time.monotonic()
        counts = retention.jobs_prune(
            finished_before=cutoff, batch_size=batch_size, dry_run=dry_run
        )
        took = time.monotonic() - start
        verb = "would delete" if dry_run else "deleted"
        self.stdout.write(
            f"{verb} {counts.jobs:,} finished jobs that ended before {cutoff:%Y-%m-%d %H:%M:%S} UTC"
            f" (older than {describe_age(older_than)}), with {counts.events:,} events,"
            f" {counts.decisions:,} dispatch decisions, {counts.webhook_deliveries:,} webhook"
            f" deliveries, {counts.webhook_attempts:,} delivery attempts and"
            f" {counts.result_files:,} result files"
            + ("" if dry_run else f"; {counts.batches} batch(es), {took:.1f} s")
        )
