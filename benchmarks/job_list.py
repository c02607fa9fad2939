#!/usr/bin/env python
"""The job list against the queue view: `GET /api/jobs/` with the member's jobs queued.

A member's list renders every queued job with its score and estimate; the
queue view plays the same queue forward for everyone. Both should cost about
one forecast. On its own database (``gpusched_bench_job_list`` on the
configured server: the embedded PostgreSQL unless DATABASE_URL is set,
recreated at every start), with dispatch paused, one member queues jobs over
two models and three bands; at each depth (`--depths`) both endpoints are
asked `--requests` times each, alternating, after `--warmup` requests of each,
through Django's test client over the real URL routing, authentication and
JSON rendering (no network). Prints p50/p90 of each and the ratio of the
medians against the goal, and rewrites the job-list section of
docs/benchmarks.md.

    .venv/bin/python benchmarks/job_list.py          # make bench-job-list
    .venv/bin/python benchmarks/job_list.py --depths 100 --requests 10 --no-doc
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import harness  # benchmarks/harness.py: database set-up, machine description, percentile

ROOT = Path(__file__).resolve().parent.parent
DATABASE = "gpusched_bench_job_list"
DOC_PATH = ROOT / "docs" / "benchmarks.md"
START, END = "<!-- job-list:start -->", "<!-- job-list:end -->"
# `GET /api/jobs/` within this many times `GET /api/queue/` (medians).
RATIO_GOAL = 1.5
ENDPOINTS = ("/api/jobs/", "/api/queue/")
# The member's jobs: two models in three bands, six queue lines.
MODELS = ("chat-small", "chat-large")
PRIORITIES = ("interactive", "normal", "batch")


@dataclass
class Depth:
    queued: int
    timings_ms: dict[str, list[float]]

    def p(self, endpoint: str, pct: float) -> float:
        return harness.percentile(self.timings_ms[endpoint], pct)

    @property
    def ratio(self) -> float:
        return self.p(ENDPOINTS[0], 50) / self.p(ENDPOINTS[1], 50)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--depths", type=int, nargs="+", default=[100, 300])
    parser.add_argument("--requests", type=int, default=30, help="measured, per endpoint")
    parser.add_argument("--warmup", type=int, default=5, help="unmeasured, per endpoint")
    parser.add_argument("--no-doc", dest="doc", action="store_false")
    return parser.parse_args(argv)


def queue_jobs(member: Any, count: int, already: int) -> None:
    from queueapp import services

    for number in range(already, already + count):
        model = MODELS[number % len(MODELS)]
        services.job_submit(
            member=member,
            path="/v1/chat/completions",
            body={"model": model, "messages": [{"role": "user", "content": f"question {number}"}]},
            model=model,
            priority_header=PRIORITIES[number % len(PRIORITIES)],
        )


def measure(client: Any, args: argparse.Namespace, queued: int) -> Depth:
    for _ in range(args.warmup):
        for endpoint in ENDPOINTS:
            assert client.get(endpoint).status_code == 200
    timings: dict[str, list[float]] = {endpoint: [] for endpoint in ENDPOINTS}
    for _ in range(args.requests):
        for endpoint in ENDPOINTS:  # alternating: other load on the machine hits both
            started = time.perf_counter()
            response = client.get(endpoint)
            timings[endpoint].append((time.perf_counter() - started) * 1000)
            assert response.status_code == 200, response.content[:300]
    listed = client.get(ENDPOINTS[0]).json()["results"]
    placed = sum(1 for job in listed if (job["estimate"] or {}).get("position") is not None)
    print(f"  {queued} queued: {placed} of {len(listed)} listed jobs have a position", flush=True)
    return Depth(queued=queued, timings_ms=timings)


def section(args: argparse.Namespace, machine: dict[str, str], depths: list[Depth]) -> str:
    at = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"Run on {at}, {machine['CPU cores (nproc)']} cores (nproc; {machine['CPU model']}), "
        f"load average at start {machine['Load average at start (1/5/15 min)']}:",
        "",
        "```sh",
        "make bench-job-list   # .venv/bin/python benchmarks/job_list.py",
        "```",
        "",
        f"{args.requests} requests of each endpoint per depth, alternating, after "
        f"{args.warmup} of each; dispatch paused; one member's jobs over "
        f"{len(MODELS)} models and {len(PRIORITIES)} bands. "
        f"Goal: `GET /api/jobs/` within {RATIO_GOAL}× `GET /api/queue/` (medians).",
        "",
        "| queued | `GET /api/jobs/` p50 | p90 "
        "| `GET /api/queue/` p50 | p90 | ratio (p50) | goal |",
        "|---:|---:|---:|---:|---:|---:|---|",
    ]
    for depth in depths:
        jobs, queue = ENDPOINTS
        met = "met" if depth.ratio <= RATIO_GOAL else "**missed**"
        lines.append(
            f"| {depth.queued} | {depth.p(jobs, 50):.1f} ms | {depth.p(jobs, 90):.1f} ms "
            f"| {depth.p(queue, 50):.1f} ms | {depth.p(queue, 90):.1f} ms "
            f"| {depth.ratio:.2f}× | {met} |"
        )
    lines += [
        "",
        "The list shows the member's 100 most recent jobs. The queue view plays 200",
        "jobs forward, the list up to 300: the horizon of a single job's estimate,",
        "so that both show the same figures.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    harness.fresh_database(DATABASE)
    from django.test import Client

    from queueapp import services
    from queueapp.models import Tier

    machine = harness.machine_info()
    services.policy_update(changes={"dispatch_paused": True})
    harness.bench_gpu()  # registered once, before anything is measured
    member, token = services.member_create(
        name="bench", tier=Tier.objects.order_by("-bonus").first(), is_staff=False
    )
    client = Client(HTTP_AUTHORIZATION=f"Bearer {token}")
    depths = []
    queued = 0
    for depth in sorted(args.depths):
        queue_jobs(member, depth - queued, queued)
        queued = depth
        harness.settle()
        depths.append(measure(client, args, queued))
    text = section(args, machine, depths)
    print()
    print(text)
    if args.doc:
        harness.write_between_markers(DOC_PATH, START, END, heading="## Job list", text=text)
    return 0 if all(depth.ratio <= RATIO_GOAL for depth in depths) else 1


if __name__ == "__main__":
    sys.exit(main())
