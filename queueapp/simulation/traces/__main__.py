"""`python -m queueapp.simulation.traces --seed 1`: rewrite fixtures/traces/."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from queueapp.simulation.traces import TRACES_DIR
from queueapp.simulation.traces.generators import write_all


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m queueapp.simulation.traces",
        description=(
            "Write the simulator's traces (studio day, its two-GPU version, flood, "
            "swap-heavy, live check, chat-heavy)."
        ),
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=TRACES_DIR)
    args = parser.parse_args(argv)
    for path in write_all(seed=args.seed, out=args.out):
        lines = sum(1 for _ in path.open())
        print(f"{path}: {lines} lines")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
