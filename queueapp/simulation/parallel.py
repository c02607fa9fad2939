"""Parallel slots against one job at a time: gpusched on the same trace twice.

`manage.py simulate TRACE --parallel MODEL=N --compare-parallel` runs the
trace with every model at one job at a time, then with the slots given, and
compares what slots are meant to change: the waits of the slotted models'
jobs, and what they may cost the rest. A swap starts only on an empty GPU,
so a GPU with a free slot that the score gives to another model drains (a
`Drain` of the run); the goal is that slots add no swap.

    .venv/bin/python -m queueapp.simulation.parallel --seeds 1-10

replays the chat-heavy trace generated from each seed, both ways, to show
whether one trace's swap count is the rule or the exception.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence

from queueapp.policy import PolicySettings
from queueapp.simulation import report
from queueapp.simulation.cluster_policies import compare_on_gpus
from queueapp.simulation.fleet import describe_parallel
from queueapp.simulation.slot_metrics import ParallelComparison, slot_figures
from queueapp.simulation.traces import Trace
from queueapp.simulation.traces.generators import CHAT_MODEL, chat_heavy

CHAT_HEAVY_PARALLEL = {CHAT_MODEL: 4}


def compare_parallel(
    trace: Trace,
    parallel: Mapping[str, int],
    *,
    gpus: int = 1,
    settings: PolicySettings | None = None,
) -> ParallelComparison:
    """gpusched on `trace`, one job at a time and then with `parallel`'s slots."""
    slotted_models = [model for model, slots in parallel.items() if slots > 1]
    (serial,) = compare_on_gpus(trace, gpus, ["gpusched"], settings)
    (slotted,) = compare_on_gpus(trace, gpus, ["gpusched"], settings, parallel=parallel)
    return ParallelComparison(
        trace=trace,
        parallel=dict(parallel),
        serial=slot_figures(serial, setting="parallel 1", slotted_models=slotted_models),
        slots=slot_figures(
            slotted, setting=describe_parallel(parallel), slotted_models=slotted_models
        ),
    )


def seed_range(text: str) -> list[int]:
    """`3` -> [3]; `1-10` -> [1, ..., 10]."""
    first, sep, last = text.partition("-")
    try:
        low = int(first)
        high = int(last) if sep else low
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a seed or a range A-B") from None
    if high < low:
        raise argparse.ArgumentTypeError(f"{text!r}: the range is empty")
    return list(range(low, high + 1))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m queueapp.simulation.parallel",
        description=(
            "gpusched on the chat-heavy trace of each seed, one job at a time and with "
            f"{describe_parallel(CHAT_HEAVY_PARALLEL)}: swaps, drains and chat waits."
        ),
    )
    parser.add_argument("--seeds", type=seed_range, default=[1], metavar="A-B")
    args = parser.parse_args(argv)
    comparisons = [compare_parallel(chat_heavy(seed), CHAT_HEAVY_PARALLEL) for seed in args.seeds]
    print(report.parallel_seeds_table(args.seeds, comparisons))
    met = sum(1 for comparison in comparisons if comparison.swap_goal_met)
    print(f"\n{report.swap_goal(comparisons[0].trace)}: met on {met} of {len(comparisons)} seeds")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
