"""`simulate TRACE --estimates`: the size-aware estimate against the per-model mean.

Three comparisons, each between runs of gpusched on the same trace:

- the ETA of the top band's jobs: |start forecast at submission − actual
  start|, mean over the jobs, each estimate forecasting on the same run
  (estimates.py);
- with callers who bound their wait (`--max-wait`, `--bounded-share`), each
  admission rule on the same bounded jobs: how many it refuses, how many of
  those did start in time (a broken promise), how many it admits that did
  not;
- shorter first inside a band: gpusched with each `shortest_first_weight`,
  each job's shortness from its size-aware median at submission: the top
  band's mean wait against Cobham's FCFS bound, the batch's done-after and
  Jain's index per band.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from queueapp.policy import PolicySettings, check_invariant
from queueapp.simulation.callers import Callers
from queueapp.simulation.cluster_policies import compare_on_gpus
from queueapp.simulation.estimates import (
    ADMISSION_RULES,
    ESTIMATES,
    MODEL_MEAN,
    SIZE,
    EtaError,
    RefusalCounts,
    eta_errors,
    refusal_counts,
)
from queueapp.simulation.metrics import Summary, summarize
from queueapp.simulation.report import band_name, duration, table
from queueapp.simulation.traces import Trace

DEFAULT_WEIGHTS = (0.0, 5.0, 10.0, 20.0, 40.0, 80.0)


@dataclass(frozen=True)
class EstimateComparison:
    eta: dict[str, EtaError]
    refusals: dict[str, RefusalCounts]  # empty without bounded callers
    sweep: list[tuple[float, Summary]]


def compare_estimates(
    trace: Trace,
    *,
    gpus: int = 1,
    settings: PolicySettings | None = None,
    callers: Callers | None = None,
    weights: Sequence[float] = DEFAULT_WEIGHTS,
) -> EstimateComparison:
    """The forecasts on one run of gpusched (with `callers`, when they bound
    their wait), then gpusched with each shortest-first weight, no callers."""
    base = settings or PolicySettings()
    bounded = callers is not None and callers.max_wait is not None
    run = compare_on_gpus(
        trace, gpus, ["gpusched"], base, callers=callers if bounded else None, forecasts=True
    )[0]
    sweep = []
    for weight in weights:
        weighted = replace(base, shortest_first_weight=weight)
        check_invariant(weighted, trace.tier_bonuses())
        swept = compare_on_gpus(trace, gpus, ["gpusched"], weighted)[0]
        sweep.append((weight, summarize(swept)))
    return EstimateComparison(
        eta=eta_errors(run), refusals=refusal_counts(run) if bounded else {}, sweep=sweep
    )


def eta_table(comparison: EstimateComparison) -> str:
    peer = comparison.eta[MODEL_MEAN].mean_abs
    rows = [
        [
            estimate,
            str(error.jobs),
            f"{error.mean_abs:.1f} s",
            _times(error.mean_abs, peer),
            str(error.unplaced),
        ]
        for estimate, error in comparison.eta.items()
    ]
    return table(
        ["estimate", "jobs", "ETA error (mean abs)", "vs per-model mean", "unplaced"], rows
    )


def refusal_table(comparison: EstimateComparison) -> str:
    today = comparison.refusals[ADMISSION_RULES[0][0]].refused_in_time
    rows = []
    for rule, counts in comparison.refusals.items():
        rows.append(
            [
                rule,
                str(counts.bounded),
                str(counts.refused),
                str(counts.refused_in_time),
                _times(counts.refused_in_time, today),
                str(counts.admitted_missed),
                "-" if math.isnan(counts.kept) else f"{counts.kept:.0%}",
            ]
        )
    return table(
        [
            "admission rule",
            "bounded",
            "refused",
            "refused, started in time",
            "vs today",
            "admitted, missed",
            "refusals kept",
        ],
        rows,
    )


def sweep_table(comparison: EstimateComparison) -> str:
    rows = []
    peer = comparison.sweep[0][1] if comparison.sweep else None
    for weight, summary in comparison.sweep:
        done = summary.batch_completion
        rows.append(
            [
                f"{weight:g}",
                duration(summary.interactive.mean),
                f"{summary.vs_bound:.3f}x",
                duration(summary.bands[summary.bottom_band].mean),
                duration(done),
                _change(done, peer.batch_completion) if peer else "-",
                ", ".join(
                    f"{band_name(band)} {index:.3f}" for band, (index, _) in summary.jain.items()
                ),
            ]
        )
    return table(
        [
            "shortest_first_weight",
            "interactive mean",
            "vs Cobham's FCFS bound",
            "batch mean",
            "batch done after",
            "vs weight 0",
            "Jain per band",
        ],
        rows,
    )


def write(comparison: EstimateComparison) -> str:
    parts = [
        f"ETA of the top band's jobs, start forecast at submission ({' vs '.join(ESTIMATES)}):",
        eta_table(comparison),
    ]
    if comparison.refusals:
        parts += [
            "Wait-bound admission, each rule judged on the same bounded jobs:",
            refusal_table(comparison),
        ]
    parts += [
        f"Shorter first inside a band (each job's shortness from its {SIZE} median):",
        sweep_table(comparison),
    ]
    return "\n\n".join(parts) + "\n"


def _times(value: float, peer: float) -> str:
    if peer == 0 or math.isnan(peer) or math.isnan(value):
        return "-"
    return f"{value / peer:.2f}x"


def _change(value: float, peer: float) -> str:
    return f"{(value - peer) / peer:+.1%}" if peer else "-"
