#!/usr/bin/env python
"""The whole claim at 100,000 queued jobs, this checkout against another, interleaved.

A change that should not slow the claim is judged against the code before
it on one queue, at the same moments. Each run seeds one database (this
checkout's schema: 100,000 queued jobs and `--finished` succeeded ones),
then starts one claiming process per checkout on it and hands them blocks
of claims in turn, before-after then after-before, so that the host's
drift (this machine's figures move by a third from minute to minute)
falls on both sides alike. Timing whole separate runs one after the other
cannot separate a change of 5 % from that drift; blocks a fraction of a
second apart can. The medians over the runs of each side's p50 and p99 are
compared, and the section of docs/benchmarks.md between the claim-pairs
markers is rewritten.

The other checkout runs on this checkout's schema: the columns a change
adds are nullable, and code that predates them never reads them.

    git worktree add /tmp/before <commit>
    .venv/bin/python benchmarks/claim_pairs.py --before /tmp/before --runs 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

WORKER_FLAG = "--worker"


def worker(checkout: Path) -> int:
    """One claiming process on `checkout`'s code: reads a count per line from
    stdin, claims that many jobs, and answers each count with one JSON line of
    the claims' times in milliseconds (wall clock and this process's CPU)."""
    from harness import bench_gpu, mark_succeeded  # puts this checkout's root first

    # The answers go out on a copy of stdout; anything the code prints goes to stderr.
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.path.insert(0, str(checkout))  # ahead of it: the code under test
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpusched.settings")
    import django

    django.setup()
    from django.db import connection
    from run import queueapp_caller

    from queueapp.dispatch.claim import ClaimedJob, job_claim_next

    # Each statement's time, by the project function that ran it (the SQL
    # itself differs between the checkouts), and the commit's.
    statements: dict[str, list[float]] = {}

    def time_statement(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        start = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            took = (time.perf_counter() - start) * 1000
            statements.setdefault(queueapp_caller().removeprefix("queueapp."), []).append(took)

    commit = connection.commit

    def timed_commit() -> None:
        start = time.perf_counter()
        try:
            commit()
        finally:
            statements.setdefault("COMMIT", []).append((time.perf_counter() - start) * 1000)

    connection.commit = timed_commit
    gpu = bench_gpu()
    for line in sys.stdin:
        wall, cpu = [], []
        statements.clear()
        for _ in range(int(line)):
            with connection.execute_wrapper(time_statement):
                start, start_cpu = time.perf_counter(), time.process_time()
                outcome = job_claim_next(resident_model="model-a", worker="bench", gpu=gpu)
                wall.append((time.perf_counter() - start) * 1000)
                cpu.append((time.process_time() - start_cpu) * 1000)
            if not isinstance(outcome, ClaimedJob):
                raise RuntimeError(f"claim returned {outcome!r}, not a job")
            mark_succeeded(outcome.job_id)
        answer = {"wall": wall, "cpu": cpu, "statements": statements}
        print(json.dumps(answer), file=answers, flush=True)
    return 0


class Claimer:
    """A worker process on one checkout, driven a block at a time."""

    def __init__(self, checkout: Path, database_url: str, log: IO[str]) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), WORKER_FLAG, str(checkout)],
            cwd=checkout,
            env={**os.environ, "DATABASE_URL": database_url},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,  # the claims' dispatch log lines
            text=True,
        )
        self.wall: list[float] = []
        self.cpu: list[float] = []
        self.statements: dict[str, list[float]] = {}

    def claim(self, count: int, *, keep: bool = True) -> None:
        assert self.process.stdin and self.process.stdout
        self.process.stdin.write(f"{count}\n")
        self.process.stdin.flush()
        answer = self.process.stdout.readline()
        if not answer:
            raise RuntimeError(f"the claimer on {self.process.args[-1]} stopped; see its log")
        if keep:
            times = json.loads(answer)
            self.wall.extend(times["wall"])
            self.cpu.extend(times["cpu"])
            for name, ms in times["statements"].items():
                self.statements.setdefault(name, []).extend(ms)

    def close(self) -> None:
        assert self.process.stdin
        self.process.stdin.close()
        self.process.wait(timeout=30)


def one_run(args: argparse.Namespace, log: IO[str]) -> dict[str, dict[str, float]]:
    """Seed a fresh database, then interleave the two checkouts' claims on it."""
    import run
    from harness import fresh_database, percentile

    if "django" in sys.modules:  # the previous run's connection, to a database dropped next
        from django.db import connections

        connections.close_all()
    os.environ["DATABASE_URL"] = args.server_url
    seed_args = run.parse_args(
        ["--claims", "1", "--finished", str(args.finished), "--no-backlog-gap", "--no-doc"]
    )
    url = fresh_database(run.BENCH_DATABASE)
    run.seed_jobs(seed_args, run.Report(seed_args))
    sides = {"before": Claimer(args.before, url, log), "after": Claimer(run.ROOT, url, log)}
    try:
        for claimer in sides.values():
            claimer.claim(args.block, keep=False)  # warms the caches and the connection
        for round_index in range(args.rounds):
            order = ("before", "after") if round_index % 2 == 0 else ("after", "before")
            for side in order:
                sides[side].claim(args.block)
    finally:
        for claimer in sides.values():
            claimer.close()
    return {
        side: {
            "p50": percentile(claimer.wall, 50),
            "p99": percentile(claimer.wall, 99),
            "cpu_p50": percentile(claimer.cpu, 50),
            **{name: percentile(ms, 50) for name, ms in claimer.statements.items()},
        }
        for side, claimer in sides.items()
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="the other checkout")
    parser.add_argument("--runs", type=int, default=5, help="seeded databases (default 5)")
    parser.add_argument("--rounds", type=int, default=30, help="blocks per side per run")
    parser.add_argument("--block", type=int, default=10, help="claims per block (default 10)")
    parser.add_argument(
        "--finished",
        type=int,
        default=200_000,
        help="finished jobs seeded (default 200000; the claim reads none of them)",
    )
    parser.add_argument("--no-doc", dest="doc", action="store_false")
    args = parser.parse_args()
    args.before = args.before.resolve()
    from harness import configured_database_url

    args.server_url = configured_database_url()  # fresh_database points DATABASE_URL away
    runs = []
    with open(os.devnull, "w") as log:
        for index in range(1, args.runs + 1):
            runs.append(one_run(args, log))
            print(f"run {index}: {json.dumps(runs[-1])}", flush=True)
    section = _section(runs, args)
    print(section)
    if args.doc:
        import run
        from harness import write_between_markers

        write_between_markers(
            run.ROOT / "docs" / "benchmarks.md",
            "<!-- claim-pairs:start -->",
            "<!-- claim-pairs:end -->",
            heading="## The claim before and after a change, interleaved",
            text=section,
        )
    return 0


def _section(runs: list[dict[str, dict[str, float]]], args: argparse.Namespace) -> str:
    def median(side: str, figure: str) -> float:
        return statistics.median(run[side][figure] for run in runs)

    rows = [
        f"| {index} | {run['before']['p50']:.2f} | {run['after']['p50']:.2f} "
        f"| {run['before']['p99']:.2f} | {run['after']['p99']:.2f} "
        f"| {run['before']['cpu_p50']:.2f} | {run['after']['cpu_p50']:.2f} |"
        for index, run in enumerate(runs, start=1)
    ]
    figures = ("p50", "p99", "cpu_p50")
    medians = {(side, f): median(side, f) for side in ("before", "after") for f in figures}
    change = {f: medians[("after", f)] / medians[("before", f)] - 1 for f in figures}
    return "\n".join(
        [
            f"{len(runs)} runs of `benchmarks/claim_pairs.py --rounds {args.rounds} "
            f"--block {args.block}`: each seeds 100,000 queued and {args.finished:,} "
            f"finished jobs, then the other checkout (`{args.before.name}`) and this one "
            f"claim {args.block} jobs each in turn, {args.rounds} times, each first in "
            f"every other round; {_machine()}.",
            "",
            "| run | p50 before (ms) | p50 after (ms) | p99 before (ms) | p99 after (ms) "
            "| CPU p50 before (ms) | CPU p50 after (ms) |",
            "|---|---|---|---|---|---|---|",
            *rows,
            "| median | "
            + " | ".join(
                f"{medians[(side, f)]:.2f}" for f in figures for side in ("before", "after")
            )
            + " |",
            "",
            f"Change of the medians: p50 {change['p50']:+.1%}, p99 {change['p99']:+.1%}, "
            f"the claiming process's CPU p50 {change['cpu_p50']:+.1%}.",
        ]
    )


def _machine() -> str:
    from harness import machine_info

    return ", ".join(f"{key} {value}" for key, value in machine_info().items())


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == WORKER_FLAG:
        sys.exit(worker(Path(sys.argv[2])))
    sys.exit(main())
