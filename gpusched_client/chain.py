"""The chain producer: one unit queued or running at a time, so the GPU frees
between units and interactive work slips in; resumable and Ctrl-C safe.

A state file in the output folder (`chain.json`) remembers when the chain's
first unit was submitted and each unit's job, so a rerun picks up a unit the
stopped run had submitted (asking the server for that job by id) instead of
submitting it again, however many other jobs the member has.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, ProgressColumn, Task
from rich.text import Text

from gpusched_client.client import Client, GpuschedError, NotFound
from gpusched_client.text import duration

STATE_FILE = "chain.json"
# Statuses in lifecycle order: a job that moves on while they are read one
# after another is found under a later one.
_REUSABLE = ("queued", "running", "succeeded")


def _clock() -> float:
    """Wall-clock seconds: elapsed time spans runs, so it cannot be monotonic."""
    return time.time()


@dataclass
class ChainState:
    """What a run leaves for the next one; written whole or not at all."""

    path: Path
    chain_id: str
    started_at: float | None = None  # the first unit's submission, `_clock()` seconds
    jobs: dict[int, int] = field(default_factory=dict)  # unit index -> its latest job
    submitting: int | None = None  # a submission whose answer may not have arrived

    @classmethod
    def load(cls, path: Path, chain_id: str) -> ChainState:
        try:
            saved = json.loads(path.read_text())
        except (FileNotFoundError, ValueError):
            return cls(path, chain_id)
        if not isinstance(saved, dict) or saved.get("chain") != chain_id:
            return cls(path, chain_id)  # another chain's folder: nothing to reuse
        return cls(
            path,
            chain_id,
            started_at=saved.get("started_at"),
            jobs={int(index): job for index, job in (saved.get("jobs") or {}).items()},
            submitting=saved.get("submitting"),
        )

    def save(self) -> None:
        saved = {
            "chain": self.chain_id,
            "started_at": self.started_at,
            "jobs": {str(index): job for index, job in sorted(self.jobs.items())},
            "submitting": self.submitting,
        }
        partial = self.path.with_suffix(".partial")
        partial.write_text(json.dumps(saved, indent=1))
        partial.rename(self.path)


def _earlier_job(client: Client, state: ChainState, index: int) -> dict[str, Any] | None:
    """The unit a stopped run submitted: reuse it, never repeat it."""
    job_id = state.jobs.get(index)
    if job_id is not None:
        try:
            job = client.get(job_id)
        except NotFound:
            job = None  # pruned long ago
        if job is not None and job["status"] in _REUSABLE:
            return job
    if state.submitting != index:
        return None
    # The run stopped between a submission and its record. The chain's counts
    # say where such a unit could be; the job lists hold the newest 100 only.
    try:
        counts = client.chain(state.chain_id)
    except NotFound:
        return None  # the submission never arrived
    wanted = {"queued": "queued", "running": "running", "succeeded": "done"}
    for status in _REUSABLE:
        if not counts.get(wanted[status]):
            continue
        for job in client.jobs(status=status):
            unit = job.get("chain") or {}
            if unit.get("id") == state.chain_id and unit.get("index") == index:
                return job
    if counts.get("queued"):
        # Queued but past the newest 100: cancel it rather than have it run twice.
        client.chain_cancel(state.chain_id)
    return None


def _save(client: Client, job: dict[str, Any], target: Path) -> None:
    result = job["result"] or {}
    if result.get("url"):
        content = client.result_bytes(job)
    else:
        content = json.dumps(result.get("body"), indent=1).encode()
    partial = target.with_suffix(".partial")
    partial.write_bytes(content)
    partial.rename(target)  # a result file on disk is always complete


def _resumed_start(client: Client, state: ChainState, resuming: bool) -> float:
    """When the chain began, so elapsed time counts across runs."""
    if state.started_at is not None:
        return state.started_at
    if resuming:
        # Results from a run that kept no state file: the first unit's start
        # is the server's nearest figure.
        try:
            started = client.chain(state.chain_id).get("started_at")
        except NotFound:
            started = None
        if started:
            return datetime.fromisoformat(started).timestamp()
    return _clock()


class _SummaryColumn(ProgressColumn):
    """`37/174 · 2 h 28 m elapsed · ~9 h 40 m left`, computed at each redraw so
    elapsed time moves while a long unit runs."""

    def __init__(self, describe: Callable[[], str]) -> None:
        super().__init__()
        self._describe = describe

    def render(self, task: Task) -> Text:
        return Text(self._describe())


def run_chain(
    client: Client,
    *,
    console: Console,
    units_file: str,
    job_path: str,
    priority: str,
    out_dir: str,
    chain_id: str | None,
    retries: int,
) -> int:
    units = [json.loads(line) for line in Path(units_file).read_text().splitlines() if line.strip()]
    chain_id = chain_id or Path(units_file).stem
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    total = len(units)
    done = [index for index in range(total) if (out / f"unit-{index:04d}.json").exists()]
    state = ChainState.load(out / STATE_FILE, chain_id)
    started = _resumed_start(client, state, resuming=bool(done))
    took: list[float] = []
    live = console.is_terminal

    def describe() -> str:
        left = (total - len(done)) * (sum(took) / len(took)) if took else None
        estimate = f" · ~{duration(left)} left" if left is not None else ""
        return f"{len(done)}/{total} · {duration(_clock() - started)} elapsed{estimate}"

    progress = Progress(
        _SummaryColumn(describe),
        BarColumn(),
        console=console,
        disable=not live,
        refresh_per_second=4,
    )
    first_pending = True
    with progress:
        bar = progress.add_task("", total=total, completed=len(done))
        try:
            for index, body in enumerate(units):
                target = out / f"unit-{index:04d}.json"
                if target.exists():
                    continue
                for attempt in range(retries + 1):
                    # Only the first unit this run reaches can have been submitted
                    # by an earlier run: units go one at a time, in order.
                    current = None
                    if attempt == 0 and first_pending:
                        current = _earlier_job(client, state, index)
                    first_pending = False
                    if current is None:
                        state.submitting = index
                        state.save()
                        submitted_at = _clock()
                        current = client.submit(
                            path=job_path,
                            body=body,
                            priority=priority,
                            chain={"id": chain_id, "index": index, "total": total},
                        )
                        if state.started_at is None:
                            # Kept across runs; an earlier figure from the server wins.
                            state.started_at = started = min(started, submitted_at)
                        state.jobs[index] = current["id"]
                        state.submitting = None
                        state.save()
                    unit_start = _clock()
                    job = client.wait(current["id"], poll_seconds=0.2)
                    if job["status"] == "succeeded":
                        took.append(_clock() - unit_start)
                        _save(client, job, target)
                        done.append(index)
                        break
                    reason = job.get("error") or job["status"]
                    if not live:
                        print(f"unit {index} {job['status']}: {reason}", flush=True)
                else:
                    print(f"stopped: unit {index} failed {retries + 1} times: {reason}", flush=True)
                    return 1
                progress.update(bar, completed=len(done))
                if not live:
                    print(describe(), flush=True)
        except KeyboardInterrupt:
            # A fresh connection: the interrupt may have cut the old one mid-request,
            # even before the answer to the unit's submission arrived.
            with Client(client.url, client.token, transport=client.transport) as fresh:
                try:
                    fresh.chain_cancel(chain_id)  # leave no unit queued behind
                except NotFound:
                    pass  # no unit reached the server
                except GpuschedError as exc:
                    print(f"could not cancel the queued unit: {exc.message}", flush=True)
            print(f"interrupted at {describe()}; run again to resume", flush=True)
            return 130
    print(f"done: {describe()}", flush=True)
    return 0
