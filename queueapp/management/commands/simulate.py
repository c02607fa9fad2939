"""``manage.py simulate TRACE``: replay a workload through the policies on a virtual clock."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from queueapp.policy import PolicyInvariantError, PolicySettings, check_invariant
from queueapp.simulation import report
from queueapp.simulation.baselines import POLICIES, compare
from queueapp.simulation.metrics import summarize, trace_bound
from queueapp.simulation.sweep import EXAMPLE, SweepError, parse_sweep, run_sweep, sweep_settings
from queueapp.simulation.traces import TraceError, load_trace


class Command(BaseCommand):
    help = (
        "Replay a trace (fixtures/traces/*.jsonl) through gpusched's policy and the "
        "baselines (FIFO, llama-swap's schedulers, strict priority) on a virtual clock, "
        "and print waits, Cobham's bound, swaps and fairness."
    )
    # Pure computation: neither the database nor the app's checks are needed.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("trace", help="a trace file, e.g. fixtures/traces/studio-day.jsonl")
        parser.add_argument(
            "--policy",
            action="append",
            choices=list(POLICIES),
            help="run only this policy (repeatable); default: all",
        )
        parser.add_argument(
            "--sweep",
            nargs="+",
            metavar="NAME=V1,V2",
            help=f"run gpusched with every combination of these settings, e.g. {EXAMPLE}",
        )
        parser.add_argument("--aging-divisor", type=float, help="seconds per point (default 60)")
        parser.add_argument("--swap-affinity-bonus", type=float, help="default 10")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            trace = load_trace(options["trace"])
        except FileNotFoundError:
            raise CommandError(f"trace file not found: {options['trace']}") from None
        except TraceError as exc:
            raise CommandError(str(exc)) from None
        overrides = {
            name: options[name]
            for name in ("aging_divisor", "swap_affinity_bonus")
            if options[name] is not None
        }
        settings = replace(PolicySettings(), **overrides)
        try:
            check_invariant(settings, trace.tier_bonuses())
        except PolicyInvariantError as exc:
            raise CommandError(str(exc)) from None
        started = time.monotonic()
        self.stdout.write(report.trace_line(trace, trace_bound(trace)))
        if options["sweep"]:
            try:
                grid = parse_sweep(options["sweep"])
                results = run_sweep(trace, sweep_settings(grid, base=settings))
            except SweepError as exc:
                raise CommandError(str(exc)) from None
            self.stdout.write("\ngpusched, each combination of the swept settings:\n")
            self.stdout.write(report.sweep_table(results))
        else:
            summaries = [summarize(run) for run in compare(trace, options["policy"], settings)]
            self.stdout.write("\n" + report.policy_table(summaries))
            self.stdout.write("\nWait per band and tier (mean / p95 / max):\n")
            self.stdout.write(report.tier_table(summaries))
            for summary in summaries:
                if summary.policy == "gpusched":
                    self.stdout.write("\ngpusched: dispatches whose order a term changed:\n")
                    self.stdout.write(report.changed_table(summary))
        self.stdout.write(f"\nsimulated in {time.monotonic() - started:.1f} s")
