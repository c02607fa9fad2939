#!/usr/bin/env python
"""Many GPUs, one queue: `make bench-gpus`.

On its own database (``gpusched_gpus`` on the configured server, recreated
at every start), three measurements in one run:

1. **One GPU, for reference.** One simulator and its dispatcher run
   `--reference-jobs` jobs of `RUN_SECONDS`; the dispatch gap (the
   simulator idle between two requests, from its own log) is the one-GPU
   figure the goal compares with.
2. **The claim as GPUs are added.** For 1, 2, 4 and 8 GPUs, as many
   processes each claim for a GPU of their own, at once, from one deep
   queue (`--claim-queue` jobs), ending each job at once: the time of one
   `job_claim_next`, p50 and p99, with every GPU claiming concurrently.
3. **Scale.** `--gpus` simulators (processes) with their own model lists
   (GPU i serves models i and i+1 of four), a dispatcher cluster per GPU,
   `--web` web servers; `--jobs` jobs over the four models submitted
   through the REST API of every web server by concurrent clients, with
   dispatch paused and then released at once (`--concurrent`: while the
   GPUs work; on a small machine the submissions then take the cores the
   dispatchers need). Checks: every job ran exactly once, no simulator ever
   had two requests in flight, every job ran on a GPU that serves its model.
   Figures: each GPU's utilisation while it had a backlog, and its dispatch
   gap.

Prints a table and rewrites the "Many GPUs, one queue (scale)" section of docs/benchmarks.md.

    .venv/bin/python benchmarks/gpus.py                    # make bench-gpus
    .venv/bin/python benchmarks/gpus.py --jobs 800 --gpus 4 --no-doc
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import random
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import harness  # benchmarks/harness.py: database set-up, machine description, percentile
import httpx

from gpusched.stack import SimulatorProcess, Stack, wait_for

ROOT = Path(__file__).resolve().parent.parent
DATABASE = "gpusched_gpus"
BENCH_DOC = ROOT / "docs" / "benchmarks.md"
START, END = "<!-- gpus:start -->", "<!-- gpus:end -->"
MODELS = ("chat", "image", "video", "embed")
RUN_SECONDS = 0.2
UTILISATION_GOAL = 0.95
GAP_ALLOWANCE_MS = 5.0
CLAIM_GPU_COUNTS = (1, 2, 4, 8)
DRAIN_TIMEOUT = 1800.0
PRIORITIES = ("interactive", "normal", "batch", "normal", "batch")


def served_by(position: int) -> dict[str, float]:
    """GPU `position`'s models: two of the four, so each model has several GPUs."""
    return {MODELS[(position + k) % len(MODELS)]: RUN_SECONDS for k in (0, 1)}


# -- 1. one GPU ------------------------------------------------------------------------


def reference_gap(stack: Stack, jobs: int) -> tuple[float, float]:
    """The one-GPU dispatch gap, p50 and p90 ms, over `jobs` queued at once."""
    from queueapp import services
    from queueapp.models import Job, JobStatus, Member

    simulator = stack.start_simulator(models={m: RUN_SECONDS for m in MODELS})
    harness.set_paused(True)
    members = list(Member.objects.all()[:8])
    for index in range(jobs):
        services.job_submit(
            member=members[index % len(members)],
            path="/v1/chat/completions",
            body={"model": MODELS[0], "messages": [], "user": f"ref-{index}"},
            model=MODELS[0],
            priority_header=None,
        )
    cluster = stack.start_cluster(
        upstream_url=f"solo={simulator.url}", GPUSCHED_GPU="solo", GPUSCHED_QUEUE_POLL="0.1"
    )
    harness.set_paused(False)
    wait_for(
        lambda: not Job.objects.filter(status__in=[JobStatus.QUEUED, JobStatus.RUNNING]).exists(),
        timeout=DRAIN_TIMEOUT,
        message="the reference jobs",
        interval=0.5,
    )
    cluster.stop()
    gaps = harness.gaps_ms(simulator_log_entries(simulator))
    simulator.stop()
    from queueapp.models import Gpu

    solo = Gpu.objects.get(name="solo")
    services.gpu_update(
        gpu=solo, enabled=False, allowed_models=[], min_band=None, max_expected_seconds=None
    )
    return harness.percentile(gaps, 50), harness.percentile(gaps, 90)


def simulator_log_entries(simulator: SimulatorProcess) -> list[dict[str, Any]]:
    return [entry for entry in simulator.log() if entry["status"] == 200]


# -- 2. the claim ----------------------------------------------------------------------


def _claimer(database_url: str, gpu_id: int, claims: int, start_at: float, out: Any) -> None:
    """One process claiming for one GPU: the seconds each claim took."""
    os.environ["DATABASE_URL"] = database_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpusched.settings")
    # A claim's decision line and activity line would flood the output.
    os.environ["GPUSCHED_DECISION_LOG_CONSOLE"] = "0"
    os.environ["GPUSCHED_LOG_LEVEL"] = "WARNING"
    import django

    django.setup()
    from queueapp.dispatch.claim import ClaimedJob, job_claim_next

    seconds: list[float] = []
    while time.time() < start_at:  # every claimer starts at the same instant
        time.sleep(0.001)
    for _ in range(claims):
        started = time.perf_counter()
        outcome = job_claim_next(resident_model=MODELS[0], worker=f"bench-{gpu_id}", gpu=gpu_id)
        seconds.append(time.perf_counter() - started)
        if not isinstance(outcome, ClaimedJob):
            break
        harness.mark_succeeded(outcome.job_id)
    out.put(seconds)


def claim_times(database_url: str, queued: int, claims: int) -> dict[int, tuple[float, float]]:
    """p50 and p99 ms of one claim, for each number of GPUs claiming at once."""
    from django.db import connections

    from queueapp import services
    from queueapp.models import Job, Member

    members = list(Member.objects.all())
    results: dict[int, tuple[float, float]] = {}
    gpus = [
        services.gpu_register(name=f"claim{i}", url=f"http://127.0.0.1:9/{i}") for i in range(8)
    ]
    harness.set_paused(False)
    context = multiprocessing.get_context("spawn")
    for count in CLAIM_GPU_COUNTS:
        for position, gpu in enumerate(gpus):  # only the GPUs that claim count as GPUs
            services.gpu_update(
                gpu=gpu,
                enabled=position < count,
                allowed_models=[],
                min_band=None,
                max_expected_seconds=None,
            )
        Job.objects.all().delete()
        _queue_directly(members, queued)
        harness.settle()
        connections.close_all()
        out = context.Queue()
        start_at = time.time() + 3.0  # after every process has set Django up
        workers = [
            context.Process(target=_claimer, args=(database_url, gpus[i].pk, claims, start_at, out))
            for i in range(count)
        ]
        for worker in workers:
            worker.start()
        seconds = [s for _ in workers for s in out.get(timeout=600)]
        for worker in workers:
            worker.join()
        ms = [s * 1000 for s in seconds]
        results[count] = (harness.percentile(ms, 50), harness.percentile(ms, 99))
        print(f"  {count} GPU(s) claiming: p50 {results[count][0]:.2f} ms", flush=True)
    for gpu in gpus:
        services.gpu_update(
            gpu=gpu, enabled=False, allowed_models=[], min_band=None, max_expected_seconds=None
        )
    Job.objects.all().delete()
    return results


def _queue_directly(members: list[Any], count: int) -> None:
    """`count` queued jobs through the service, as submissions would leave them."""
    from queueapp import services

    rng = random.Random(7)
    for index in range(count):
        model = MODELS[index % len(MODELS)]
        services.job_submit(
            member=members[index % len(members)],
            path="/v1/chat/completions",
            body={"model": model, "messages": []},
            model=model,
            priority_header=rng.choice(PRIORITIES),
        )


# -- 3. scale --------------------------------------------------------------------------


@dataclass
class Scale:
    gpus: int
    jobs: int
    submit_seconds: float = 0.0
    drain_seconds: float = 0.0
    answers: Counter[int] = field(default_factory=Counter)
    utilisation: dict[str, float] = field(default_factory=dict)
    gap_p50_ms: dict[str, float] = field(default_factory=dict)
    ran: dict[str, int] = field(default_factory=dict)
    checks: dict[str, str] = field(default_factory=dict)


async def _submit(
    urls: list[str], tokens: list[str], jobs: int, clients: int, models: list[str]
) -> Counter[int]:
    statuses: Counter[int] = Counter()
    rng = random.Random(11)
    work = [(index, rng.choice(models)) for index in range(jobs)]

    async def client(number: int) -> None:
        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        headers = {"Authorization": f"Bearer {tokens[number % len(tokens)]}"}
        url = urls[number % len(urls)]  # the clients are spread over the web servers
        async with httpx.AsyncClient(
            base_url=url, headers=headers, limits=limits, timeout=120
        ) as http:
            for index, model in work[number::clients]:
                body = {"model": model, "messages": [], "user": f"job-{index:05d}"}
                response = await http.post(
                    "/api/jobs/",
                    json={"path": "/v1/chat/completions", "body": body},
                    headers={"X-LlamaSwap-Priority": PRIORITIES[index % len(PRIORITIES)]},
                )
                statuses[response.status_code] += 1

    await asyncio.gather(*(client(number) for number in range(clients)))
    return statuses


def scale(stack: Stack, args: argparse.Namespace, tokens: list[str]) -> Scale:
    from queueapp.models import Gpu, Job, JobStatus

    outcome = Scale(gpus=args.gpus, jobs=args.jobs)
    simulators = {f"gpu{i}": stack.start_simulator(models=served_by(i)) for i in range(args.gpus)}
    upstreams = ",".join(f"{name}={sim.url}" for name, sim in simulators.items())
    for name in simulators:
        # As `make run` starts them (the end-to-end tests poll faster).
        stack.start_cluster(upstream_url=upstreams, GPUSCHED_GPU=name, GPUSCHED_QUEUE_POLL="0.1")
    webs = [stack.start_web(upstream_url=upstreams) for _ in range(args.web)]
    wait_for(
        lambda: (
            Gpu.objects.filter(name__in=list(simulators), served_models__isnull=False).count()
            == len(simulators)
        ),
        message="every dispatcher to read its GPU's models",
    )
    if not args.concurrent:
        harness.set_paused(True)
    started = time.perf_counter()
    outcome.answers = asyncio.run(
        _submit(
            [web.url for web in webs],
            tokens,
            args.jobs,
            args.clients,
            sorted({model for i in range(args.gpus) for model in served_by(i)}),
        )
    )
    outcome.submit_seconds = time.perf_counter() - started
    print(f"  submitted {args.jobs:,} in {outcome.submit_seconds:.1f} s", flush=True)
    if not args.concurrent:
        harness.set_paused(False)  # the whole backlog at once
        started = time.perf_counter()

    def drained() -> bool:
        stack.check_alive()
        return not Job.objects.filter(status__in=[JobStatus.QUEUED, JobStatus.RUNNING]).exists()

    wait_for(drained, timeout=DRAIN_TIMEOUT, message="every job run", interval=1.0)
    outcome.drain_seconds = time.perf_counter() - started
    logs = {name: simulator_log_entries(sim) for name, sim in simulators.items()}
    everything = [sim.log() for sim in simulators.values()]
    _check(outcome, logs, everything)
    for name, entries in logs.items():
        outcome.ran[name] = len(entries)
        outcome.utilisation[name] = _utilisation(entries)
        gaps = harness.gaps_ms(entries)
        outcome.gap_p50_ms[name] = harness.percentile(gaps, 50) if gaps else float("nan")
    return outcome


def _utilisation(entries: list[dict[str, Any]]) -> float:
    """Busy share between the GPU's first request and its last start: while
    it had a backlog (the last request's own run is not idle time anyway)."""
    ordered = sorted(entries, key=lambda entry: entry["received_at"])
    if len(ordered) < 2:
        return float("nan")
    window = ordered[-1]["received_at"] - ordered[0]["received_at"]
    busy = sum(entry["finished_at"] - entry["received_at"] for entry in ordered[:-1])
    return min(1.0, busy / window) if window > 0 else float("nan")


def _check(
    outcome: Scale, logs: dict[str, list[dict[str, Any]]], everything: list[list[dict[str, Any]]]
) -> None:
    from queueapp.models import Job, JobStatus

    outcome.checks["every submission answered 201"] = (
        "ok" if set(outcome.answers) == {201} else str(dict(outcome.answers))
    )
    ran = Counter(entry["body"]["user"] for entries in logs.values() for entry in entries)
    twice = [label for label, n in ran.items() if n > 1]
    missing = outcome.jobs - len(ran)
    statuses = Counter(Job.objects.values_list("status", flat=True))
    problems = []
    if twice:
        problems.append(f"{len(twice)} ran twice or more, e.g. {twice[0]}")
    if missing:
        problems.append(f"{missing} never ran")
    if statuses != Counter({JobStatus.SUCCEEDED: outcome.jobs}):
        problems.append(f"statuses {dict(statuses)}")
    outcome.checks["every job ran exactly once"] = "ok" if not problems else "; ".join(problems)
    overlaps = 0
    refused = 0
    for entries in everything:
        refused += sum(entry["status"] == 429 for entry in entries)
        spans = sorted(
            (e["received_at"], e["finished_at"]) for e in entries if e["finished_at"] is not None
        )
        overlaps += sum(
            1 for (_, end), (start, _) in zip(spans, spans[1:], strict=False) if start < end
        )
    outcome.checks["no GPU ever had two requests in flight"] = (
        "ok" if not overlaps and not refused else f"{overlaps} overlaps, {refused} refused (429)"
    )
    recorded = dict(Job.objects.values_list("body__user", "gpu__name"))
    wrong, misrecorded = 0, 0
    for name, entries in logs.items():
        serves = served_by(int(name.removeprefix("gpu")))
        wrong += sum(entry["model"] not in serves for entry in entries)
        misrecorded += sum(recorded.get(entry["body"]["user"]) != name for entry in entries)
    outcome.checks["every job ran on a GPU that serves its model, as recorded"] = (
        "ok"
        if not wrong and not misrecorded
        else f"{wrong} on a GPU not serving their model, {misrecorded} recorded on another GPU"
    )


# -- output ----------------------------------------------------------------------------


def section(
    args: argparse.Namespace,
    machine: dict[str, str],
    reference: tuple[float, float],
    claims: dict[int, tuple[float, float]],
    outcome: Scale,
) -> str:
    gap_goal = reference[0] + GAP_ALLOWANCE_MS
    worst_use = min(outcome.utilisation.values())
    worst_gap = max(outcome.gap_p50_ms.values())
    per_gpu = "\n".join(
        f"| {name} | {', '.join(served_by(int(name[3:])))} | {outcome.ran[name]:,}"
        f" | {outcome.utilisation[name]:.1%} | {outcome.gap_p50_ms[name]:.1f} |"
        for name in sorted(outcome.utilisation, key=lambda n: int(n[3:]))
    )
    claim_rows = "\n".join(
        f"| {count} | {p50:.2f} | {p99:.2f} |" for count, (p50, p99) in sorted(claims.items())
    )

    def met(ok: bool) -> str:
        return "met" if ok else "**not met**"

    return "\n".join(
        [
            f"Run on {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {machine['CPU cores (nproc)']} cores"
            f" (nproc; {machine['CPU model']}), load average at start"
            f" {machine['Load average at start (1/5/15 min)']}:",
            "",
            "```sh",
            f".venv/bin/python benchmarks/gpus.py --gpus {args.gpus} --jobs {args.jobs}"
            f" --web {args.web} --clients {args.clients} --members {args.members}"
            + (" --concurrent" if args.concurrent else ""),
            "```",
            "",
            f"{args.gpus} simulated GPUs (each a llama-swap simulator process serving two of"
            f" the four models, {RUN_SECONDS * 1000:.0f} ms a job, no swap cost), a dispatcher"
            f" cluster each, {args.web} web servers; {args.jobs:,} jobs submitted through the"
            f" REST API of both web servers by {args.clients} clients of {args.members} members"
            + (
                f" while the GPUs worked (`--concurrent`). Submitting took"
                f" {outcome.submit_seconds:.1f} s; the last job ended"
                f" {outcome.drain_seconds:.1f} s after the first submission."
                if args.concurrent
                else f" with dispatch paused ({outcome.submit_seconds:.1f} s), then released at"
                f" once: the last job ended {outcome.drain_seconds:.1f} s later, against"
                f" {outcome.jobs * RUN_SECONDS / args.gpus:.1f} s if every GPU were never idle."
            ),
            "",
            "| Figure | Goal | Measured | |",
            "|---|---|---:|---|",
            f"| GPU utilisation while it had a backlog, worst GPU | ≥ {UTILISATION_GOAL:.0%}"
            f" | {worst_use:.1%} | {met(worst_use >= UTILISATION_GOAL)} |",
            f"| dispatch gap p50, worst GPU | ≤ one GPU's {reference[0]:.1f} ms"
            f" + {GAP_ALLOWANCE_MS:.0f} ms = {gap_goal:.1f} ms | {worst_gap:.1f} ms"
            f" | {met(worst_gap <= gap_goal)} |",
            "",
            "Per GPU (utilisation: busy share from its first request to its last; gap: the"
            " simulator idle between two requests, from its own log):",
            "",
            "| GPU | Models | Jobs run | Utilisation | Gap p50 ms |",
            "|---|---|---:|---:|---:|",
            per_gpu,
            "",
            f"One GPU alone, for reference ({args.reference_jobs} jobs queued at once, same"
            f" {RUN_SECONDS * 1000:.0f} ms jobs): gap p50 {reference[0]:.1f} ms, p90"
            f" {reference[1]:.1f} ms.",
            "",
            f"The claim (`job_claim_next`) as GPUs are added: that many processes each claim for"
            f" a GPU of their own at the same time, {args.claims} claims each, from"
            f" {args.claim_queue:,} queued jobs:",
            "",
            "| GPUs claiming at once | Claim p50 ms | Claim p99 ms |",
            "|---:|---:|---:|",
            claim_rows,
            "",
            *harness.checks_table(outcome.checks),
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--web", type=int, default=2)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--members", type=int, default=40)
    parser.add_argument("--reference-jobs", type=int, default=300)
    parser.add_argument("--claim-queue", type=int, default=2000)
    parser.add_argument("--claims", type=int, default=100)
    parser.add_argument(
        "--concurrent",
        action="store_true",
        help="submit while the GPUs work (default: submit paused, then release the backlog)",
    )
    parser.add_argument("--no-doc", action="store_true", help="print only")
    args = parser.parse_args(argv)
    database_url = harness.fresh_database(DATABASE)
    from queueapp import services
    from queueapp.models import Tier

    machine = harness.machine_info()
    tiers = list(Tier.objects.filter(name__in=["free", "pro", "max"]))
    created = [
        services.member_create(name=f"member{i:02d}", tier=tiers[i % len(tiers)])
        for i in range(args.members)
    ]
    tokens = [token for _, token in created]
    print("1. one GPU, for reference", flush=True)
    log_dir = Path(tempfile.mkdtemp(prefix="gpusched-bench-gpus-"))
    with Stack(database_url=database_url, log_dir=log_dir / "reference") as stack:
        reference = reference_gap(stack, args.reference_jobs)
    print(f"  gap p50 {reference[0]:.1f} ms", flush=True)
    print("2. the claim as GPUs are added", flush=True)
    claims = claim_times(database_url, args.claim_queue, args.claims)
    print(f"3. {args.gpus} GPUs, {args.jobs:,} jobs", flush=True)
    with Stack(database_url=database_url, log_dir=log_dir / "scale") as stack:
        outcome = scale(stack, args, tokens)
    text = section(args, machine, reference, claims, outcome)
    print("\n" + text)
    if not args.no_doc:
        harness.write_between_markers(
            BENCH_DOC, START, END, heading="## Many GPUs, one queue (scale)", text=text
        )
    return 0 if all(result == "ok" for result in outcome.checks.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
