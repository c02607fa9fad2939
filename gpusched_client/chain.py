"""The chain producer: one unit queued or running at a time, so the GPU frees
between units and interactive work slips in; resumable and Ctrl-C safe."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn

from gpusched_client.client import Client, GpuschedError
from gpusched_client.text import duration


def _existing_job(client: Client, chain_id: str, index: int) -> dict[str, Any] | None:
    """A unit submitted by an earlier run that was stopped: reuse, never repeat."""
    for status in ("running", "queued", "succeeded"):
        for job in client.jobs(status=status):
            unit = job.get("chain") or {}
            if unit.get("id") == chain_id and unit.get("index") == index:
                return job
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
    took: list[float] = []
    started = time.monotonic()
    live = console.is_terminal
    progress = Progress(
        TextColumn("{task.description}"), BarColumn(), console=console, disable=not live
    )

    def describe() -> str:
        left = (total - len(done)) * (sum(took) / len(took)) if took else None
        estimate = f" · ~{duration(left)} left" if left is not None else ""
        return f"{len(done)}/{total} · {duration(time.monotonic() - started)} elapsed{estimate}"

    with progress:
        bar = progress.add_task(describe(), total=total, completed=len(done))
        try:
            for index, body in enumerate(units):
                target = out / f"unit-{index:04d}.json"
                if target.exists():
                    continue
                for attempt in range(retries + 1):
                    current = _existing_job(client, chain_id, index) if attempt == 0 else None
                    if current is None:
                        current = client.submit(
                            path=job_path,
                            body=body,
                            priority=priority,
                            chain={"id": chain_id, "index": index, "total": total},
                        )
                    unit_start = time.monotonic()
                    job = client.wait(current["id"], poll_seconds=0.2)
                    if job["status"] == "succeeded":
                        took.append(time.monotonic() - unit_start)
                        _save(client, job, target)
                        done.append(index)
                        break
                    reason = job.get("error") or job["status"]
                    if not live:
                        print(f"unit {index} {job['status']}: {reason}", flush=True)
                else:
                    print(f"stopped: unit {index} failed {retries + 1} times: {reason}", flush=True)
                    return 1
                progress.update(bar, completed=len(done), description=describe())
                if not live:
                    print(describe(), flush=True)
        except KeyboardInterrupt:
            # A fresh connection: the interrupt may have cut the old one mid-request,
            # even before the answer to the unit's submission arrived.
            with Client(client.url, client.token) as fresh:
                queued = [
                    job
                    for job in fresh.jobs(status="queued")
                    if (job.get("chain") or {}).get("id") == chain_id
                ]
                for job in queued:  # leave no unit queued behind
                    try:
                        fresh.cancel(job["id"])
                    except GpuschedError:
                        pass  # it started meanwhile: it runs to its end; a rerun picks it up
            print(f"interrupted at {describe()}; run again to resume", flush=True)
            return 130
    print(f"done: {describe()}", flush=True)
    return 0
