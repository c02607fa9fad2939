"""What parallel slots changed, in figures: each run's swaps, drains and the
waits slots are meant to change (`SlotFigures`), and the two runs of a
comparison side by side (`ParallelComparison`). `parallel` runs the
comparison and `report` prints it; both import the figures from here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from queueapp.simulation.engine import Run
from queueapp.simulation.metrics import Summary, WaitStats, summarize, wait_stats
from queueapp.simulation.traces import Trace


@dataclass(frozen=True)
class SlotFigures:
    """One run of the comparison."""

    setting: str  # "parallel 1" or the slots given, e.g. "chat-small=4"
    summary: Summary
    slotted: WaitStats  # jobs of the models given slots
    top_band_others: WaitStats  # top-band jobs of every other model
    makespan: float  # from the first dispatch allowed to the last end
    # Drains after which the GPU, once empty, chose its own model again: the
    # job it drained for lost the fresh choice (say to a job that arrived
    # meanwhile, or one whose member's running limit had kept it out).
    drains_undone: int

    @property
    def swaps(self) -> int:
        return self.summary.swaps

    @property
    def drains(self) -> int:
        return self.summary.drains


@dataclass(frozen=True)
class ParallelComparison:
    trace: Trace
    parallel: dict[str, int]
    serial: SlotFigures  # every model at parallel 1
    slots: SlotFigures  # with `parallel`

    @property
    def slotted_models(self) -> list[str]:
        return [model for model, slots in self.parallel.items() if slots > 1]

    @property
    def swap_goal_met(self) -> bool:
        return self.slots.swaps <= self.serial.swaps


def undone_drains(run: Run) -> int:
    """Drains whose GPU's next start was no swap: nothing starts on a GPU
    while it drains, so that start is the choice made when it emptied."""
    undone = 0
    for drain in run.drains:
        later = run.dispatches[drain.dispatches_before :]
        following = next((d for d in later if d.gpu == drain.gpu), None)
        if following is not None and not following.swapped:
            undone += 1
    return undone


def slot_figures(run: Run, *, setting: str, slotted_models: Sequence[str]) -> SlotFigures:
    summary = summarize(run)
    top = max((d.job.band for d in run.dispatches), default=0)
    slotted = [d.wait for d in run.dispatches if d.job.model in slotted_models]
    others = [
        d.wait for d in run.dispatches if d.job.model not in slotted_models and d.job.band == top
    ]
    return SlotFigures(
        setting=setting,
        summary=summary,
        slotted=wait_stats(slotted),
        top_band_others=wait_stats(others),
        makespan=(summary.finished_at - run.trace.dispatch_from) if run.dispatches else math.nan,
        drains_undone=undone_drains(run),
    )
