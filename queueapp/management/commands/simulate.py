"""``manage.py simulate TRACE``: replay a workload through the policies on a virtual clock."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import yaml
from django.core.management.base import BaseCommand, CommandError, CommandParser

from queueapp.policy import (
    MAX_PARALLEL,
    PolicyInvariantError,
    PolicySettings,
    Reservation,
    check_invariant,
)
from queueapp.policy.decide import Borrowing
from queueapp.policy.routing import RoutingConfigError, UnknownModel
from queueapp.simulation import estimate_report, report
from queueapp.simulation.baselines import POLICIES, compare
from queueapp.simulation.callers import Callers
from queueapp.simulation.cluster_policies import (
    CLUSTER_POLICIES,
    DEFAULT_RESERVATIONS,
    cluster_policy_names,
    compare_on_gpus,
)
from queueapp.simulation.engine import Run
from queueapp.simulation.fleet import (
    PARALLEL_EXAMPLE,
    RESERVATION_EXAMPLE,
    ParallelError,
    ReservationError,
    gpu_specs,
    parse_parallel,
    parse_reservations,
)
from queueapp.simulation.llama_swap import (
    NAME as LLAMA_SWAP_SETS,
)
from queueapp.simulation.llama_swap import (
    LlamaSwapConfig,
    llama_swap_config,
    simulate_llama_swap,
    simulate_llama_swap_round_robin,
)
from queueapp.simulation.metrics import Summary, summarize, trace_bound
from queueapp.simulation.parallel import compare_parallel
from queueapp.simulation.sweep import EXAMPLE, SweepError, parse_sweep, run_sweep, sweep_settings
from queueapp.simulation.traces import Trace, TraceError, load_trace

RESERVED_POLICY = "gpusched+reserve"


class Command(BaseCommand):
    help = (
        "Replay a trace (fixtures/traces/*.jsonl) through gpusched's policy and the "
        "baselines (FIFO, llama-swap's schedulers, strict priority; with --gpus N, "
        "llama-swap per GPU behind a round-robin or least-busy balancer) on a virtual "
        "clock, and print waits, Cobham's bound, swaps and fairness. --parallel MODEL=N gives "
        "a model slots (several of its jobs at once on a GPU where it is loaded)."
    )
    # Pure computation: neither the database nor the app's checks are needed.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("trace", help="a trace file, e.g. fixtures/traces/studio-day.jsonl")
        _add_policy_arguments(parser)
        _add_parallel_arguments(parser)
        _add_borrowing_arguments(parser)
        _add_caller_arguments(parser)
        parser.add_argument(
            "--llama-swap-config",
            metavar="PATH",
            help=(
                f"a llama-swap config (YAML, e.g. fixtures/llama-swap/studio.yaml): adds the "
                f"{LLAMA_SWAP_SETS} baseline, llama-swap v250's FIFO scheduler keeping the "
                "config's sets of models loaded together; with --gpus N, gpusched reads the "
                "sets and llama-swap alone runs on each GPU behind round-robin"
            ),
        )
        parser.add_argument(
            "--estimates",
            action="store_true",
            help="compare the size-aware estimate with the per-model mean on gpusched: the "
            "top band's ETA error, wait-bound refusals (with --max-wait) and shorter first "
            "inside a band (--shortest-first-weights)",
        )
        parser.add_argument(
            "--shortest-first-weights",
            default=",".join(f"{w:g}" for w in estimate_report.DEFAULT_WEIGHTS),
            metavar="W1,W2",
            help="with --estimates, the shortest_first_weight values run (default %(default)s)",
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
        gpus = options["gpus"]
        if gpus < 1:
            raise CommandError(f"--gpus must be at least 1, got {gpus}")
        parallel = self.parallel(options["parallel"], trace)
        sets = self.llama_swap_config(options["llama_swap_config"])
        started = time.monotonic()
        if options["estimates"]:
            self.estimates(trace, settings, gpus, options)
        elif options["compare_parallel"]:
            self.compare_parallel(trace, parallel, settings, gpus, options)
        elif options["sweep"]:
            if options["reserve"]:
                raise CommandError("--sweep runs gpusched without a reservation; drop --reserve")
            self.sweep(trace, options["sweep"], settings, gpus, parallel)
        else:
            names: list[str] | None = options["policy"]
            reservations = self.reservations(options["reserve"], names, gpus)
            one_gpu_policies = names is None or all(name in POLICIES for name in names)
            callers = self.callers(options)
            one_gpu = gpus == 1 and one_gpu_policies and not parallel and not callers.active
            if sets is not None and not one_gpu and callers.active:
                raise CommandError(
                    "--llama-swap-config does not replay callers who leave or bound their "
                    "wait: drop the callers' options"
                )
            if one_gpu:
                summaries = self.one_gpu(trace, names, settings, sets)
            else:
                # Slots on one GPU: the one-GPU policies, each on the shared queue.
                if names is None and gpus == 1:
                    names = list(POLICIES)
                self.stdout.write(
                    report.cluster_trace_line(
                        trace, gpus, self.describe(reservations, names), parallel
                    )
                )
                if callers.active:
                    self.stdout.write(f"callers: {callers.describe()}\n")
                runs = compare_on_gpus(
                    trace,
                    gpus,
                    names,
                    settings,
                    reservations,
                    parallel,
                    self.borrowing(options),
                    callers,
                    routing=sets.routing if sets is not None else None,
                )
                if sets is not None:
                    runs.append(self.llama_swap_sets(trace, sets, gpus))
                summaries = [summarize(run) for run in runs]
                self.stdout.write("\n" + report.cluster_table(summaries))
                self.never_started(summaries)
            self.stdout.write("\nWait per band and tier (mean / p95 / max):\n")
            self.stdout.write(report.tier_table(summaries))
            for summary in summaries:
                if summary.policy in ("gpusched", "gpusched+sets"):
                    self.stdout.write("\ngpusched: dispatches whose order a term changed:\n")
                    self.stdout.write(report.changed_table(summary))
        self.stdout.write(f"\nsimulated in {time.monotonic() - started:.1f} s")

    def estimates(
        self, trace: Trace, settings: PolicySettings, gpus: int, options: dict[str, Any]
    ) -> None:
        """`--estimates`: the size-aware estimate against the per-model mean."""
        for option in ("policy", "reserve", "sweep", "parallel", "llama_swap_config"):
            if options[option]:
                raise CommandError(
                    f"--estimates runs gpusched alone; drop --{option.replace('_', '-')}"
                )
        if options["callers_leave"]:
            raise CommandError("--estimates replays no caller who leaves; drop --callers-leave")
        try:
            weights = [float(text) for text in options["shortest_first_weights"].split(",")]
            comparison = estimate_report.compare_estimates(
                trace, gpus=gpus, settings=settings, callers=self.callers(options), weights=weights
            )
        except (ValueError, PolicyInvariantError) as exc:
            raise CommandError(f"--estimates: {exc}") from None
        self.stdout.write(report.cluster_trace_line(trace, gpus))
        self.stdout.write("\n" + estimate_report.write(comparison))

    def one_gpu(
        self,
        trace: Trace,
        names: list[str] | None,
        settings: PolicySettings,
        sets: LlamaSwapConfig | None,
    ) -> list[Summary]:
        """The one-GPU policies on `trace`, llama-swap alone with its sets
        (given a config) just before gpusched; their table written."""
        self.stdout.write(report.trace_line(trace, trace_bound(trace)))
        runs = compare(trace, names, settings)
        if sets is not None:
            runs.insert(
                len([run for run in runs if run.policy != "gpusched"]),
                self.llama_swap_sets(trace, sets),
            )
        summaries = [summarize(run) for run in runs]
        self.stdout.write("\n" + report.policy_table(summaries))
        return summaries

    @staticmethod
    def llama_swap_config(path: str | None) -> LlamaSwapConfig | None:
        if path is None:
            return None
        try:
            raw = yaml.safe_load(Path(path).read_text())
        except OSError as exc:
            raise CommandError(f"--llama-swap-config: cannot read {path}: {exc}") from None
        except yaml.YAMLError as exc:
            raise CommandError(f"--llama-swap-config {path}: not YAML: {exc}") from None
        if not isinstance(raw, dict):
            raise CommandError(f"--llama-swap-config {path}: not a mapping of llama-swap keys")
        try:
            return llama_swap_config(raw)
        except RoutingConfigError as exc:
            raise CommandError(f"--llama-swap-config {path}: {exc}") from None

    @staticmethod
    def llama_swap_sets(trace: Trace, sets: LlamaSwapConfig, gpus: int = 1) -> Run:
        try:
            if gpus > 1:
                return simulate_llama_swap_round_robin(trace, sets, gpus)
            return simulate_llama_swap(trace, sets)
        except UnknownModel as exc:
            raise CommandError(f"--llama-swap-config: {exc.args[0]}") from None

    @staticmethod
    def callers(options: dict[str, Any]) -> Callers:
        try:
            return Callers(
                max_wait=options["max_wait"],
                bounded_share=options["bounded_share"],
                leave_share=options["callers_leave"],
            )
        except ValueError as exc:
            raise CommandError(str(exc).replace("_", "-", 1)) from None

    @staticmethod
    def borrowing(options: dict[str, Any]) -> Borrowing:
        keep_idle, max_seconds = options["borrow_keep_idle"], options["borrow_max_seconds"]
        if keep_idle < 0:
            raise CommandError(f"--borrow-keep-idle must be at least 0, got {keep_idle}")
        if max_seconds is not None and max_seconds < 0:
            raise CommandError(f"--borrow-max-seconds must be at least 0, got {max_seconds}")
        return Borrowing(keep_idle=keep_idle, max_seconds=max_seconds)

    def sweep(
        self,
        trace: Trace,
        arguments: list[str],
        settings: PolicySettings,
        gpus: int,
        parallel: dict[str, int],
    ) -> None:
        if gpus == 1 and not parallel:
            self.stdout.write(report.trace_line(trace, trace_bound(trace)))
        else:
            self.stdout.write(report.cluster_trace_line(trace, gpus, parallel=parallel))
        try:
            grid = parse_sweep(arguments)
            results = run_sweep(
                trace, sweep_settings(grid, base=settings), gpus=gpus, parallel=parallel
            )
        except SweepError as exc:
            raise CommandError(str(exc)) from None
        on = "" if gpus == 1 else f" on {gpus} GPUs"
        self.stdout.write(f"\ngpusched{on}, each combination of the swept settings:\n")
        self.stdout.write(report.sweep_table(results))

    @staticmethod
    def parallel(texts: list[str] | None, trace: Trace) -> dict[str, int]:
        try:
            parallel = parse_parallel(texts or [])
        except ParallelError as exc:
            raise CommandError(f"--parallel: {exc}") from None
        models = sorted({job.model for job in trace.jobs})
        unknown = [model for model in parallel if model not in models]
        if unknown:
            raise CommandError(
                f"--parallel: no job of trace {trace.name} uses {', '.join(unknown)}; "
                f"its models: {', '.join(models)}"
            )
        return parallel

    def compare_parallel(
        self,
        trace: Trace,
        parallel: dict[str, int],
        settings: PolicySettings,
        gpus: int,
        options: dict[str, Any],
    ) -> None:
        if not any(slots > 1 for slots in parallel.values()):
            raise CommandError(
                f"--compare-parallel needs a model with more than one slot, e.g. "
                f"--parallel {PARALLEL_EXAMPLE}"
            )
        for option in ("policy", "reserve", "sweep"):
            if options[option]:
                raise CommandError(
                    f"--compare-parallel runs gpusched alone, unreserved; drop --{option}"
                )
        self.stdout.write(report.cluster_trace_line(trace, gpus, parallel=parallel))
        comparison = compare_parallel(trace, parallel, gpus=gpus, settings=settings)
        self.stdout.write("\n" + report.parallel_table(comparison))
        self.stdout.write("\n" + report.parallel_goal_line(comparison))
        summaries = [
            replace(figures.summary, policy=f"gpusched, {figures.setting}")
            for figures in (comparison.serial, comparison.slots)
        ]
        self.stdout.write("\nWait per band and tier (mean / p95 / max):\n")
        self.stdout.write(report.tier_table(summaries))

    def reservations(
        self, texts: list[str] | None, names: list[str] | None, gpus: int
    ) -> dict[str, Reservation]:
        if not texts:
            return {}
        running = names or (list(CLUSTER_POLICIES) if gpus > 1 else list(POLICIES))
        if RESERVED_POLICY not in running:
            raise CommandError(
                f"--reserve sets {RESERVED_POLICY}'s reservations, and it is not among the "
                f"policies run; add --policy {RESERVED_POLICY}"
            )
        try:
            reservations = parse_reservations(texts)
            gpu_specs(gpus, reservations)  # every name must be a simulated GPU
        except ReservationError as exc:
            raise CommandError(str(exc)) from None
        return reservations

    @staticmethod
    def describe(reservations: dict[str, Reservation], names: list[str] | None) -> str:
        if names is not None and RESERVED_POLICY not in names:
            return ""
        chosen = reservations or DEFAULT_RESERVATIONS
        return ", ".join(f"{name} ({r.describe()})" for name, r in chosen.items())

    def never_started(self, summaries: list[Summary]) -> None:
        for summary in summaries:
            if summary.never_started:
                self.stdout.write(
                    f"\n{summary.policy}: {summary.never_started} jobs never started: every "
                    "GPU's reservation kept them out; their waits are not in the figures"
                )


def _add_policy_arguments(parser: CommandParser) -> None:
    """Which policies run, on how many GPUs, with which reservations or settings."""
    parser.add_argument(
        "--policy",
        action="append",
        choices=list(dict.fromkeys([*POLICIES, *cluster_policy_names()])),
        help=(
            "run only this policy (repeatable); default: all one-GPU policies, or with "
            f"--gpus N > 1 {', '.join(CLUSTER_POLICIES)}"
        ),
    )
    parser.add_argument(
        "--gpus",
        type=int,
        default=1,
        metavar="N",
        help="GPUs (gpu0, gpu1, ...), each serving every model, in front of one queue (default 1)",
    )
    parser.add_argument(
        "--reserve",
        action="append",
        metavar="GPU:SETTING=VALUE,...",
        help=f"{RESERVED_POLICY}'s reservation of a GPU (repeatable), e.g. "
        f"{RESERVATION_EXAMPLE} (its default): the GPU takes a job only when its band is "
        "at least min_band or its model's learned run time is under max_expected_seconds",
    )
    parser.add_argument(
        "--sweep",
        nargs="+",
        metavar="NAME=V1,V2",
        help=f"run gpusched with every combination of these settings, e.g. {EXAMPLE}",
    )


def _add_parallel_arguments(parser: CommandParser) -> None:
    """A model's slots, and the run without them to compare with."""
    parser.add_argument(
        "--parallel",
        action="append",
        metavar="MODEL=N",
        help=f"give a model N slots, 1 to {MAX_PARALLEL} (repeatable), e.g. "
        f"{PARALLEL_EXAMPLE}: a GPU with it loaded runs up to N of its jobs at once, "
        "each slower the more share the GPU; other models run one at a time",
    )
    parser.add_argument(
        "--compare-parallel",
        action="store_true",
        help="run gpusched twice, one job at a time and with the --parallel slots, and "
        "compare swaps, drains, the slotted models' waits and the makespan",
    )


def _add_borrowing_arguments(parser: CommandParser) -> None:
    """gpusched's borrowing guard: when a GPU is lent past a running limit."""
    parser.add_argument(
        "--borrow-keep-idle",
        type=int,
        default=0,
        metavar="N",
        help="gpusched's borrowing guard (the policy's borrow_keep_idle_gpus): lend a GPU "
        "past a member's running limit only while N other GPUs stay idle (default 0)",
    )
    parser.add_argument(
        "--borrow-max-seconds",
        type=float,
        metavar="SECONDS",
        help="the policy's borrow_max_seconds: lend a GPU past the running limit only for "
        "jobs whose model's learned run time is under SECONDS (default: any job)",
    )


def _add_caller_arguments(parser: CommandParser) -> None:
    """What callers do: bound their wait, or leave mid-run."""
    parser.add_argument(
        "--max-wait",
        type=float,
        metavar="SECONDS",
        help="callers bound their wait (X-Gpusched-Max-Wait): a job still queued after "
        "SECONDS expires and is counted; --bounded-share says which share of the jobs",
    )
    parser.add_argument(
        "--bounded-share",
        type=float,
        default=1.0,
        metavar="FRACTION",
        help="the share of the jobs, drawn from their ids, that carry --max-wait (default 1)",
    )
    parser.add_argument(
        "--callers-leave",
        type=float,
        default=0.0,
        metavar="FRACTION",
        help="the share of the top band's callers who leave half-way through their "
        "run: a chat's request is closed and its GPU frees, any other model is "
        "drained (its GPU held to the end: on_caller_gone)",
    )
