"""Tables (Markdown, readable in a terminal too) and plots of simulator runs."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from queueapp.policy import TERMS, PolicySettings
from queueapp.simulation.engine import Run
from queueapp.simulation.fleet import describe_parallel
from queueapp.simulation.metrics import Summary, WaitStats
from queueapp.simulation.slot_metrics import ParallelComparison
from queueapp.simulation.sweep import SWEEPABLE
from queueapp.simulation.traces import Trace

BAND_NAMES = {100: "interactive", 0: "normal", -100: "batch"}


def band_name(band: int) -> str:
    return BAND_NAMES.get(band, f"band {band:+d}")


def duration(seconds: float) -> str:
    """Compact and readable: 42 s, 12.5 min, 3.4 h."""
    if seconds is None or math.isnan(seconds):
        return "-"
    if math.isinf(seconds):
        return "inf"
    if seconds < 120:
        return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def ratio(value: float) -> str:
    if value is None or math.isnan(value):
        return "-"
    return f"{value:.2f}x" if value < 10 else f"{value:.0f}x"


def excess(value: float) -> str:
    """A ratio to a bound as a difference: 1.096 -> +9.6 %."""
    if value is None or math.isnan(value) or math.isinf(value):
        return "-"
    return f"{(value - 1) * 100:+.1f} %"


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table with padded columns."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows, strict=True)]

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    return "\n".join(
        [line(headers), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)]
    )


def _stats(stats: WaitStats | None) -> str:
    if stats is None or stats.count == 0:
        return "-"
    return f"{duration(stats.mean)} / {duration(stats.p95)} / {duration(stats.max)}"


def _jain(summary: Summary) -> str:
    return (
        ", ".join(
            f"{band_name(band)} {index:.2f} ({members})"
            for band, (index, members) in summary.jain.items()
            if members > 1
        )
        or "-"
    )


def chain_results(summary: Summary) -> str:
    parts = []
    for name, chain in summary.chains.items():
        state = "" if chain.done == chain.units else f" ({chain.done}/{chain.units} done)"
        parts.append(f"{name} {duration(chain.completion_seconds)}{state}")
    return ", ".join(parts) or "-"


def policy_table(summaries: Sequence[Summary]) -> str:
    """One row per policy, same trace, same run."""
    fifo = next((s for s in summaries if s.policy == "fifo"), None)
    headers = [
        "policy",
        "interactive mean / p95 / max",
        "vs bound",
        "FIFO / this",
        "normal mean",
        "batch mean",
        "batch done after",
        "chains",
        "swaps",
        "swap time",
        "longest wait",
        "Jain (members)",
    ]
    rows = []
    for s in summaries:
        normal = s.bands.get(0)
        bottom = s.bands.get(s.bottom_band) if s.bottom_band != s.top_band else None
        rows.append(
            [
                s.policy,
                _stats(s.interactive),
                excess(s.vs_bound),
                ratio(fifo.interactive.mean / s.interactive.mean) if fifo else "-",
                duration(normal.mean) if normal else "-",
                duration(bottom.mean) if bottom else "-",
                duration(s.batch_completion) if bottom else "-",
                chain_results(s),
                str(s.swaps),
                duration(s.swap_seconds),
                f"{duration(s.longest_wait)} ({s.longest_wait_job})",
                _jain(s),
            ]
        )
    return table(headers, rows)


def busy_shares(summary: Summary) -> str:
    return ", ".join(f"{name} {share * 100:.0f} %" for name, share in summary.gpu_busy.items())


def expired_counts(summary: Summary) -> str:
    """Jobs expired in the queue, in all and per band."""
    total = sum(summary.expired.values())
    if not total:
        return "0"
    bands = ", ".join(f"{count} band {band:+d}" for band, count in summary.expired.items())
    return f"{total} ({bands})"


def cluster_table(summaries: Sequence[Summary], *, baseline: str = "round-robin+collate") -> str:
    """One row per policy on several GPUs. No Cobham bound: it is one server's.
    With parallel slots, the drains and the most jobs one GPU ran at once too.
    `borrowed`: starts lent past the member's running limit (gpusched)."""
    reference = next((s for s in summaries if s.policy == baseline), None)
    slots = any(s.parallel for s in summaries)
    callers = any(s.callers for s in summaries)
    headers = [
        "policy",
        "interactive mean / p95 / max",
        f"{baseline} / this",
        "normal mean",
        "batch mean",
        "batch done after",
        "chains",
        "swaps",
        *(["drains", "most in flight"] if slots else []),
        "borrowed",
        *(["expired", "callers left / drained"] if callers else []),
        "longest wait",
        "Jain (members)",
        "GPU busy",
    ]
    rows = []
    for s in summaries:
        normal = s.bands.get(0)
        bottom = s.bands.get(s.bottom_band) if s.bottom_band != s.top_band else None
        unstarted = f" ({s.never_started} never started)" if s.never_started else ""
        rows.append(
            [
                s.policy + unstarted,
                _stats(s.interactive),
                ratio(reference.interactive.mean / s.interactive.mean) if reference else "-",
                duration(normal.mean) if normal else "-",
                duration(bottom.mean) if bottom else "-",
                duration(s.batch_completion) if bottom else "-",
                chain_results(s),
                str(s.swaps),
                *([str(s.drains), str(s.most_in_flight)] if slots else []),
                str(s.borrowed),
                *(
                    [expired_counts(s), f"{s.callers_left} / {duration(s.drained_seconds)}"]
                    if callers
                    else []
                ),
                f"{duration(s.longest_wait)} ({s.longest_wait_job})",
                _jain(s),
                busy_shares(s),
            ]
        )
    return table(headers, rows)


def swap_goal(trace: Trace) -> str:
    return f"swaps, {trace.name} trace: no more than with parallel 1"


def parallel_table(comparison: ParallelComparison) -> str:
    """gpusched one job at a time against the slots given, same trace."""
    models = ", ".join(comparison.slotted_models) or "slotted models"
    headers = [
        "gpusched",
        "swaps",
        f"{models} wait mean / p95",
        "interactive, other models: mean wait",
        "batch mean",
        "makespan",
        "drains (undone)",
        "most in flight",
    ]
    rows = []
    for figures in (comparison.serial, comparison.slots):
        s = figures.summary
        bottom = s.bands.get(s.bottom_band) if s.bottom_band != s.top_band else None
        rows.append(
            [
                figures.setting,
                str(s.swaps),
                f"{duration(figures.slotted.mean)} / {duration(figures.slotted.p95)}",
                duration(figures.top_band_others.mean),
                duration(bottom.mean) if bottom else "-",
                duration(figures.makespan),
                f"{s.drains} ({figures.drains_undone})",
                str(s.most_in_flight),
            ]
        )
    return table(headers, rows)


def parallel_goal_line(comparison: ParallelComparison) -> str:
    met = "met" if comparison.swap_goal_met else "not met"
    return (
        f"{swap_goal(comparison.trace)}: {comparison.slots.swaps} with "
        f"{comparison.slots.setting} against {comparison.serial.swaps} with parallel 1: {met}"
    )


def parallel_seeds_table(seeds: Sequence[int], comparisons: Sequence[ParallelComparison]) -> str:
    """One row per seed of a generated trace: parallel 1 -> the slots given."""
    models = ", ".join(comparisons[0].slotted_models) if comparisons else "slotted models"
    headers = [
        "seed",
        "swaps",
        "drains (undone)",
        f"{models} wait mean",
        "interactive, other models: mean wait",
        "makespan",
        "goal",
    ]

    def change(before: str, after: str) -> str:
        return f"{before} -> {after}"

    rows = [
        [
            str(seed),
            change(str(c.serial.swaps), str(c.slots.swaps)),
            f"{c.slots.drains} ({c.slots.drains_undone})",
            change(duration(c.serial.slotted.mean), duration(c.slots.slotted.mean)),
            change(duration(c.serial.top_band_others.mean), duration(c.slots.top_band_others.mean)),
            change(duration(c.serial.makespan), duration(c.slots.makespan)),
            "met" if c.swap_goal_met else "not met",
        ]
        for seed, c in zip(seeds, comparisons, strict=True)
    ]
    return table(headers, rows)


def tier_table(summaries: Sequence[Summary]) -> str:
    """Per band and tier: mean / p95 / max wait under each policy."""
    order = summaries[0].tier_order
    keys = sorted(
        {key for s in summaries for key in s.tiers},
        key=lambda k: (-k[0], order.index(k[1]) if k[1] in order else len(order), k[1]),
    )
    headers = ["band", "tier", "jobs", *(s.policy for s in summaries)]
    rows = []
    for band, tier in keys:
        count = next((s.tiers[(band, tier)].count for s in summaries if (band, tier) in s.tiers), 0)
        cells = [_stats(s.tiers.get((band, tier))) for s in summaries]
        rows.append([band_name(band), tier, str(count), *cells])
    return table(headers, rows)


def changed_table(summary: Summary) -> str:
    """How often each term changed which job went first, per band."""
    headers = ["band", "dispatches", *TERMS]
    rows = []
    for band, stats in summary.bands.items():
        counts = summary.changed_by_band.get(band, dict.fromkeys(TERMS, 0))
        rows.append([band_name(band), str(stats.count), *(str(counts[t]) for t in TERMS)])
    rows.append(["all", str(summary.jobs), *(str(summary.changed_by[t]) for t in TERMS)])
    return table(headers, rows)


def sweep_table(results: Sequence[tuple[PolicySettings, Summary]]) -> str:
    varied = [
        name for name in SWEEPABLE if len({getattr(settings, name) for settings, _ in results}) > 1
    ] or ["aging_divisor", "swap_affinity_bonus"]
    headers = [
        *varied,
        "interactive mean / p95",
        "vs bound",
        "normal mean",
        "batch mean",
        "chains",
        "swaps",
        "longest wait",
        "Jain (members)",
        "changed by aging / affinity / tier / fairness",
    ]
    rows = []
    for settings, s in results:
        normal = s.bands.get(0)
        bottom = s.bands.get(s.bottom_band) if s.bottom_band != s.top_band else None
        rows.append(
            [
                *(f"{getattr(settings, name):g}" for name in varied),
                f"{duration(s.interactive.mean)} / {duration(s.interactive.p95)}",
                excess(s.vs_bound),
                duration(normal.mean) if normal else "-",
                duration(bottom.mean) if bottom else "-",
                chain_results(s),
                str(s.swaps),
                duration(s.longest_wait),
                _jain(s),
                " / ".join(str(s.changed_by[t]) for t in TERMS),
            ]
        )
    return table(headers, rows)


def trace_line(trace: Trace, bound: float) -> str:
    return (
        f"trace {trace.name}: {len(trace.jobs)} jobs over {duration(trace.duration_seconds)}, "
        f"{len(trace.members)} members, swap {trace.swap_seconds:g} s; Cobham's bound for the "
        f"top band's mean wait: {duration(bound)}"
    )


def cluster_trace_line(
    trace: Trace, gpus: int, reservations: str = "", parallel: Mapping[str, int] | None = None
) -> str:
    reserved = f"; gpusched+reserve reserves {reservations}" if reservations else ""
    slots = f"; parallel {describe_parallel(parallel)} (other models 1)" if parallel else ""
    return (
        f"trace {trace.name}: {len(trace.jobs)} jobs over {duration(trace.duration_seconds)}, "
        f"{len(trace.members)} members, swap {trace.swap_seconds:g} s, "
        f"{'on 1 GPU, serving' if gpus == 1 else f'on {gpus} GPUs, each serving'} every "
        f"model{reserved}{slots}"
    )


# -- plots ----------------------------------------------------------------------------------


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_waits(
    summaries: Sequence[Summary], path: Path, *, with_bound: bool = True, title: str = ""
) -> None:
    """Mean wait per band, one bar per policy, with Cobham's bound (one GPU's:
    leave it out for several)."""
    plt = _pyplot()
    from matplotlib import ticker

    bands = sorted({band for s in summaries for band in s.bands}, reverse=True)
    fig, ax = plt.subplots(figsize=(8, 4.2))
    width = 0.8 / len(summaries)
    for i, s in enumerate(summaries):
        xs = [b + (i - (len(summaries) - 1) / 2) * width for b in range(len(bands))]
        ys = [s.bands[band].mean / 60 if band in s.bands else 0 for band in bands]
        ax.bar(xs, ys, width, label=s.policy)
    if with_bound:
        bound = summaries[0].bound / 60
        ax.hlines(bound, -0.45, 0.45, colors="black", linestyles="dashed", label="Cobham's bound")
    ax.set_xticks(range(len(bands)), [band_name(b) for b in bands])
    ax.set_ylabel("mean wait (min, log scale)")
    ax.set_yscale("log")
    plain = ticker.FormatStrFormatter("%g")
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(plain)
    ax.set_title(f"{title or summaries[0].trace}: mean wait per band")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_interactive_cdf(
    runs: Sequence[Run], bound: float | None, path: Path, *, title: str = ""
) -> None:
    """Distribution of the top band's waits under each policy (no bound line
    when `bound` is None)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.2))
    for run in runs:
        top = max(d.job.band for d in run.dispatches)
        waits = sorted(d.wait / 60 for d in run.dispatches if d.job.band == top)
        ax.plot(waits, [(i + 1) / len(waits) for i in range(len(waits))], label=run.policy)
    if bound is not None:
        ax.axvline(bound / 60, color="black", linestyle="dashed", label="Cobham's bound (mean)")
    ax.set_xscale("symlog", linthresh=1)
    ax.set_xlabel("wait of a top-band job (min)")
    ax.set_ylabel("fraction of jobs")
    ax.set_title(f"{title or runs[0].trace.name}: top-band waits")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_chain_progress(runs: Sequence[Run], chain: str, path: Path) -> None:
    """Units of a chain finished over time under each policy."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.2))
    for run in runs:
        ends = sorted(d.finished_at / 3600 for d in run.dispatches if d.job.job.chain == chain)
        ax.step(ends, range(1, len(ends) + 1), where="post", label=run.policy)
    ax.set_xlabel("hours since the start of the trace")
    ax.set_ylabel(f"{chain}: units finished")
    ax.set_title(f"{runs[0].trace.name}: {chain} progress")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_swaps(by_trace: dict[str, Sequence[Summary]], path: Path) -> None:
    """Swaps per trace and policy."""
    plt = _pyplot()
    traces = list(by_trace)
    policies = [s.policy for s in by_trace[traces[0]]]
    fig, ax = plt.subplots(figsize=(8, 4.2))
    width = 0.8 / len(policies)
    for i, policy in enumerate(policies):
        xs = [t + (i - (len(policies) - 1) / 2) * width for t in range(len(traces))]
        ys = [next(s.swaps for s in by_trace[name] if s.policy == policy) for name in traces]
        ax.bar(xs, ys, width, label=policy)
    ax.set_xticks(range(len(traces)), traces)
    ax.set_ylabel("model swaps")
    ax.set_title("Swaps per trace")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
