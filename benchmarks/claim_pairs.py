#!/usr/bin/env python
"""The whole claim at 100,000 queued jobs, this checkout against another, in pairs.

A change that should not slow the claim is judged by paired runs in one
session: each pair runs `benchmarks/run.py --claim-only` on the other
checkout (`--before`, e.g. a `git worktree` of the commit before the
change, with this run.py and harness.py copied in) and on this one, one
after the other, so both see the same machine, each first in every other
pair so that an effect of the order falls on both alike. The medians of the pairs'
p50 and p99 are compared; the section of docs/benchmarks.md between the
claim-pairs markers is rewritten.

    git worktree add /tmp/before <commit>
    cp benchmarks/run.py benchmarks/harness.py /tmp/before/benchmarks/
    .venv/bin/python benchmarks/claim_pairs.py --before /tmp/before --runs 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from harness import ROOT, machine_info, write_between_markers

DOC_PATH = ROOT / "docs" / "benchmarks.md"
START, END = "<!-- claim-pairs:start -->", "<!-- claim-pairs:end -->"


def claim_figures(checkout: Path, claims: int, finished: int) -> dict[str, float]:
    """One `run.py --claim-only` in `checkout`: its last line, as JSON."""
    done = subprocess.run(
        [
            sys.executable,
            "benchmarks/run.py",
            "--claim-only",
            "--claims",
            str(claims),
            "--finished",
            str(finished),
        ],
        cwd=checkout,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="the other checkout")
    parser.add_argument("--runs", type=int, default=5, help="pairs (default 5)")
    parser.add_argument("--claims", type=int, default=300, help="timed claims per run")
    parser.add_argument(
        "--finished",
        type=int,
        default=200_000,
        help="finished jobs seeded (default 200000; the claim reads none of them)",
    )
    parser.add_argument("--no-doc", dest="doc", action="store_false")
    args = parser.parse_args()
    pairs = []
    for run in range(1, args.runs + 1):
        # Each checkout goes first in every other pair, so that an effect of
        # the order (the second run starts while PostgreSQL may still write
        # out the first's load) falls on both alike.
        if run % 2:
            before = claim_figures(args.before, args.claims, args.finished)
            after = claim_figures(ROOT, args.claims, args.finished)
        else:
            after = claim_figures(ROOT, args.claims, args.finished)
            before = claim_figures(args.before, args.claims, args.finished)
        pairs.append((before, after))
        print(f"pair {run}: before {before}, after {after}", flush=True)
    section = _section(pairs, args)
    print(section)
    if args.doc:
        write_between_markers(
            DOC_PATH,
            START,
            END,
            heading="## The claim before and after a change, in pairs",
            text=section,
        )
    return 0


def _section(
    pairs: list[tuple[dict[str, float], dict[str, float]]], args: argparse.Namespace
) -> str:
    rows = [
        f"| {index} | {b['claim_p50_ms']:.2f} | {a['claim_p50_ms']:.2f} "
        f"| {b['claim_p99_ms']:.2f} | {a['claim_p99_ms']:.2f} |"
        for index, (b, a) in enumerate(pairs, start=1)
    ]
    medians = {
        (side, figure): statistics.median(pair[index][figure] for pair in pairs)
        for index, side in enumerate(("before", "after"))
        for figure in ("claim_p50_ms", "claim_p99_ms")
    }
    change = {
        figure: medians[("after", figure)] / medians[("before", figure)] - 1
        for figure in ("claim_p50_ms", "claim_p99_ms")
    }
    return "\n".join(
        [
            f"{len(pairs)} pairs of `benchmarks/run.py --claim-only --claims {args.claims}` "
            f"(100,000 queued, {args.finished:,} finished), the other checkout "
            f"`{args.before.name}` first in the odd pairs, this one in the even; "
            f"{_machine()}.",
            "",
            "| pair | p50 before (ms) | p50 after (ms) | p99 before (ms) | p99 after (ms) |",
            "|---|---|---|---|---|",
            *rows,
            f"| median | {medians[('before', 'claim_p50_ms')]:.2f} "
            f"| {medians[('after', 'claim_p50_ms')]:.2f} "
            f"| {medians[('before', 'claim_p99_ms')]:.2f} "
            f"| {medians[('after', 'claim_p99_ms')]:.2f} |",
            "",
            f"Change of the medians: p50 {change['claim_p50_ms']:+.1%}, "
            f"p99 {change['claim_p99_ms']:+.1%}.",
        ]
    )


def _machine() -> str:
    """The host, as the other benchmarks describe it (Django set up for its
    database version)."""
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpusched.settings")
    django.setup()
    return ", ".join(f"{key} {value}" for key, value in machine_info().items())


if __name__ == "__main__":
    sys.exit(main())
