"""``manage.py simulate_llama_swap``: the built-in llama-swap simulator as a management command."""

from __future__ import annotations

import argparse
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from queueapp.upstream.simulator import cli


class Command(BaseCommand):
    help = (
        "Run a simulated llama-swap (one GPU, one resident model, up to --parallel requests "
        "of it at once) until SIGINT/SIGTERM."
    )
    # The simulator needs neither the database nor the app registry being healthy.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        cli.add_arguments(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        code = cli.run(argparse.Namespace(**options))
        if code:
            raise CommandError(f"llama-swap simulator exited with status {code}", returncode=code)
