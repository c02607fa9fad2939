#!/usr/bin/env python
"""Benchmark of parallel slots (a model whose jobs share a GPU), side by side.

One run, on its own database (``gpusched_bench_parallel`` on the configured
server: the embedded PostgreSQL unless DATABASE_URL is set, recreated at every
start), with the built-in llama-swap simulator as a batching server (chat
answers 4 requests at once, each slowed by `batched_seconds`), a GPU cluster
and Daphne as separate processes, through the official `openai` package:

1. 4, 16 and 64 concurrent chat callers through gpusched (chat `parallel` 4),
   against the same callers calling the simulator directly. The simulator
   refuses a fifth request while four run (429, as llama-swap's concurrency
   limit), so the direct callers queue on their side, four at a time: the
   best any client gets from a server that answers four at once. Wall time,
   errors, and from the simulator's log: the most requests in flight, and
   whether two models ever overlapped; then the 64 through gpusched with
   chat at parallel 1, as before slots;
2. an interactive image submitted while 12 streaming chats run: when it
   started against the longest chat in flight plus the swap, and whether a
   chat slot was granted after it arrived;
3. the policy simulator on the chat-heavy trace, parallel 1 against chat 4:
   swaps, waits, drains.

Prints the results and rewrites the parallel-slots section of
docs/benchmarks.md. Exits 1 when a correctness check fails; a missed goal is
a figure to read.

    .venv/bin/python benchmarks/parallel.py            # make bench-parallel
    .venv/bin/python benchmarks/parallel.py --no-doc   # print only
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import frontdoor  # benchmarks/frontdoor.py: the callers' process
import harness  # benchmarks/harness.py: database set-up, machine description, doc
import httpx

from gpusched.stack import Stack, wait_for

ROOT = Path(__file__).resolve().parent.parent
DATABASE = "gpusched_bench_parallel"
DOC_PATH = ROOT / "docs" / "benchmarks.md"
START, END = "<!-- parallel:start -->", "<!-- parallel:end -->"

CHAT, IMAGE = "chat", "image"
CHAT_SECONDS = 1.0  # alone; four at once take batched_seconds(1.0, 4) = 1.45 s each
IMAGE_SECONDS = 2.0
SWAP_SECONDS = 2.0
PARALLEL = 4
CALLER_COUNTS = (4, 16, 64)
WALL_GOAL_FACTOR = 1.15
IMAGE_TEST_CHATS = 12


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-doc", action="store_true", help="do not rewrite docs/benchmarks.md")
    return parser.parse_args(argv)


def served(sim_log: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [entry for entry in sim_log if entry["status"] == 200]


def most_in_flight(entries: list[dict[str, Any]]) -> int:
    edges = sorted(
        [(e["started_at"], 1) for e in entries] + [(e["finished_at"], -1) for e in entries]
    )
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def models_overlap(entries: list[dict[str, Any]]) -> int:
    """Pairs of requests of different models whose times overlapped."""
    ordered = sorted(entries, key=lambda e: e["started_at"])
    found = 0
    for i, first in enumerate(ordered):
        for second in ordered[i + 1 :]:
            if second["started_at"] >= first["finished_at"]:
                break
            found += first["model"] != second["model"]
    return found


def run_callers(log_dir: Path, name: str, **spec: Any) -> dict[str, Any]:
    callers = frontdoor.Callers(log_dir, name, model=CHAT, **spec)
    try:
        return callers.wait()
    finally:
        callers.stop()


def wall(outcome: dict[str, Any]) -> float:
    results = outcome["results"]
    return max(r["t1"] for r in results) - min(r["t0"] for r in results)


def failures(outcome: dict[str, Any]) -> int:
    return sum(1 for r in outcome["results"] if r.get("status") != 200 or not r.get("ok"))


def callers_round(
    stack: Stack, sim_url: str, web_url: str, tokens: list[str], count: int
) -> dict[str, Any]:
    """`count` callers directly, then through gpusched; the simulator's log of each."""
    figures: dict[str, Any] = {"count": count}
    for path, url in (("direct", sim_url), ("gpusched", web_url)):
        httpx.post(f"{sim_url}/sim/reset", timeout=10).raise_for_status()
        outcome = run_callers(
            stack.log_dir,
            f"{path}-{count}",
            url=url,
            tokens=tokens[:count] if path == "gpusched" else ["direct"],
            count=count,
            at_once=PARALLEL if path == "direct" else 0,
        )
        log = served(frontdoor.sim_log(sim_url))
        figures[path] = {
            "wall": wall(outcome),
            "failures": failures(outcome),
            "answered": len(log),
            "most_in_flight": most_in_flight(log),
            "overlaps": models_overlap(log),
        }
        print(f"  {count} callers {path}: {figures[path]}", flush=True)
    figures["ratio"] = figures["gpusched"]["wall"] / figures["direct"]["wall"]
    return figures


def image_while_chats_stream(
    stack: Stack, sim_url: str, web_url: str, tokens: list[str], image_token: str
) -> dict[str, Any]:
    """An interactive image submitted over REST while streaming chats run."""
    from queueapp.models import DispatchDecision, Job, JobStatus

    httpx.post(f"{sim_url}/sim/reset", timeout=10).raise_for_status()
    callers = frontdoor.Callers(
        stack.log_dir,
        "image-test-chats",
        model=CHAT,
        url=web_url,
        tokens=tokens[:IMAGE_TEST_CHATS],
        count=IMAGE_TEST_CHATS,
        stream=True,
    )
    try:
        wait_for(
            lambda: Job.objects.filter(model=CHAT, status=JobStatus.RUNNING).count() == PARALLEL,
            timeout=60,
            message="four chats in flight",
        )
        arrived = time.time()
        answer = httpx.post(
            f"{web_url}/api/jobs/",
            json={
                "path": "/v1/images/generations",
                "body": {"model": IMAGE, "prompt": "a lighthouse at dusk"},
            },
            headers={
                "Authorization": f"Bearer {image_token}",
                "X-LlamaSwap-Priority": "interactive",
            },
            timeout=30,
        )
        answer.raise_for_status()
        image_id = answer.json()["id"]
        in_flight_at_arrival = list(
            Job.objects.filter(model=CHAT, status=JobStatus.RUNNING).values_list("pk", flat=True)
        )
        outcome = callers.wait()
    finally:
        callers.stop()
    image = wait_for(
        lambda: Job.objects.filter(pk=image_id, status=JobStatus.SUCCEEDED).first(),
        timeout=60,
        message="the image to end",
    )
    chats_in_flight = Job.objects.filter(pk__in=in_flight_at_arrival)
    longest_end = max(job.finished_at for job in chats_in_flight)
    granted_after = DispatchDecision.objects.filter(
        job__model=CHAT, at__gt=image.submitted_at, at__lt=image.started_at
    ).count()
    log = served(frontdoor.sim_log(sim_url))
    image_entry = next(e for e in log if e["model"] == IMAGE)
    # At the simulator: its request arrived after the last chat in flight
    # freed the GPU, then paid the swap.
    waited = image_entry["started_at"] - arrived
    bound = longest_end.timestamp() - arrived + SWAP_SECONDS
    figures = {
        "waited": waited,
        "bound": bound,
        "dispatch_after_last_chat": (image.started_at - longest_end).total_seconds(),
        "in_flight_at_arrival": len(in_flight_at_arrival),
        "granted_after": granted_after,
        "chat_failures": failures(outcome),
        "overlaps": models_overlap(log),
    }
    print(f"  image while chats stream: {figures}", flush=True)
    return figures


# The chat-heavy trace generated from these seeds too (seed 1 is the committed one).
SEEDS = range(1, 11)


def policy_simulator() -> tuple[Any, list[Any]]:
    """The committed chat-heavy trace, and the same trace from each seed."""
    from queueapp.simulation.parallel import CHAT_HEAVY_PARALLEL, compare_parallel
    from queueapp.simulation.traces.generators import chat_heavy

    seeds = [compare_parallel(chat_heavy(seed), CHAT_HEAVY_PARALLEL) for seed in SEEDS]
    return seeds[0], seeds


def report_text(
    args: argparse.Namespace,
    machine: dict[str, str],
    rounds: list[dict[str, Any]],
    serial: dict[str, Any],
    image: dict[str, Any],
    comparison: Any,
    seeds: list[Any],
    checks: dict[str, str],
) -> str:
    from queueapp.policy import batched_seconds
    from queueapp.simulation import report

    def met(ok: bool) -> str:
        return "met" if ok else "**not met**"

    last = rounds[-1]
    lines = [
        f"Run at {datetime.now(UTC):%Y-%m-%d %H:%M} UTC by `make bench-parallel` "
        "(benchmarks/parallel.py), in one run:",
        "",
        *(f"- {key}: {value}" for key, value in machine.items()),
        "",
        f"The simulator answers `{CHAT}` ({CHAT_SECONDS:g} s alone) {PARALLEL} at once, each "
        f"request slowed by 15 % per extra one in flight (four at once: "
        f"{batched_seconds(CHAT_SECONDS, 4):.2f} s each); `{IMAGE}` "
        f"({IMAGE_SECONDS:g} s) one at a time; a swap costs {SWAP_SECONDS:g} s. gpusched has "
        f"`{CHAT}` parallel {PARALLEL}, one cluster, one Daphne. Direct callers queue on their "
        f"side, {PARALLEL} at a time (the simulator answers a fifth 429); callers through "
        "gpusched all call at once, one member each.",
        "",
        "| figure | goal | measured | |",
        "|---|---|---|---|",
        f"| wall time of {last['count']} concurrent chat calls, gpusched against direct "
        f"| ≤ {WALL_GOAL_FACTOR:g} × direct "
        f"| {last['ratio']:.3f} × ({last['gpusched']['wall']:.2f} s against "
        f"{last['direct']['wall']:.2f} s) | {met(last['ratio'] <= WALL_GOAL_FACTOR)} |",
        "| an interactive image arriving while chats stream | starts within the longest "
        "in-flight chat plus the swap; no chat slot granted after it arrived "
        f"| reached the simulator {image['waited']:.2f} s after it arrived (bound "
        f"{image['bound']:.2f} s); {image['granted_after']} chat slots granted after it "
        f"| {met(image['waited'] <= image['bound'] and image['granted_after'] == 0)} |",
        f"| swaps, chat-heavy trace (policy simulator) | no more than with parallel 1 "
        f"| {comparison.slots.swaps} with {comparison.slots.setting} against "
        f"{comparison.serial.swaps} with parallel 1 (the committed trace; the same trace "
        f"from seeds {SEEDS[0]}-{SEEDS[-1]}: met on {sum(c.swap_goal_met for c in seeds)}, "
        f"{min(c.slots.swaps - c.serial.swaps for c in seeds):+d} to "
        f"{max(c.slots.swaps - c.serial.swaps for c in seeds):+d} swaps) "
        f"| {met(comparison.swap_goal_met)} on the committed trace |",
        "",
        "Concurrent chat callers (openai SDK, `AsyncOpenAI`), wall time from the first call "
        "to the last answer:",
        "",
        "| callers | direct | gpusched | gpusched / direct | most in flight (direct / gpusched) "
        "| failed calls |",
        "|---|---|---|---|---|---|",
        *(
            f"| {r['count']} | {r['direct']['wall']:.2f} s | {r['gpusched']['wall']:.2f} s "
            f"| {r['ratio']:.3f} | {r['direct']['most_in_flight']} / "
            f"{r['gpusched']['most_in_flight']} | {r['direct']['failures']} / "
            f"{r['gpusched']['failures']} |"
            for r in rounds
        ),
        "",
        f"Before parallel slots (chat at parallel 1, every call one at a time through "
        f"gpusched): {last['count']} callers took {serial['wall']:.2f} s, "
        f"{serial['wall'] / last['direct']['wall']:.2f} × direct ({serial['failures']} failed).",
        "",
        f"The image: {image['in_flight_at_arrival']} chats were in flight when it arrived; "
        f"gpusched dispatched it {image['dispatch_after_last_chat'] * 1000:.0f} ms after the "
        f"last of them ended.",
        "",
        *harness.checks_table(checks),
        "",
        "The policy simulator, chat-heavy trace (seed 1, one GPU; the seeds and why slots "
        'add swaps on most of them: "Parallel slots in the policy simulator" above):',
        "",
        report.parallel_table(comparison),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    if argv is None and len(sys.argv) == 3 and sys.argv[1] == "--callers":
        return frontdoor.callers_process(sys.argv[2])
    args = parse_args(argv)
    database_url = harness.fresh_database(DATABASE)
    machine = harness.machine_info()
    for name in ("httpx", "httpx2", "openai"):
        logging.getLogger(name).setLevel(logging.WARNING)
    from queueapp import services
    from queueapp.models import Tier

    services.model_parallel_set(name=CHAT, parallel=PARALLEL)
    tier = Tier.objects.get(name="pro")
    count = max(CALLER_COUNTS)
    tokens = [services.member_create(name=f"caller{n:03d}", tier=tier)[1] for n in range(count)]
    image_token = services.member_create(name="painter", tier=tier)[1]

    log_dir = ROOT / "var" / "bench-parallel"
    with Stack(database_url=database_url, log_dir=log_dir) as stack:
        simulator = stack.start_simulator(
            models={CHAT: CHAT_SECONDS, IMAGE: IMAGE_SECONDS},
            swap_seconds=SWAP_SECONDS,
            parallel_models={CHAT: PARALLEL},
        )
        stack.start_cluster()
        web = stack.start_web(GPUSCHED_DB_POOL="20")
        # A first call loads the chat model, so no round pays the first swap.
        run_callers(log_dir, "warm-up", url=web.url, tokens=tokens[:1], count=1)
        print("concurrent chat callers:", flush=True)
        rounds = [
            callers_round(stack, simulator.url, web.url, tokens, count) for count in CALLER_COUNTS
        ]
        print("the same callers with chat at parallel 1 (one at a time):", flush=True)
        services.model_parallel_set(name=CHAT, parallel=1)
        one_at_a_time = run_callers(
            log_dir, f"serial-{count}", url=web.url, tokens=tokens, count=count
        )
        services.model_parallel_set(name=CHAT, parallel=PARALLEL)
        serial = {"wall": wall(one_at_a_time), "failures": failures(one_at_a_time)}
        print(f"  {count} callers, parallel 1: {serial}", flush=True)
        print("an interactive image while chats stream:", flush=True)
        image = image_while_chats_stream(stack, simulator.url, web.url, tokens, image_token)
        stack.check_alive()
    print("the policy simulator, chat-heavy trace:", flush=True)
    comparison, seeds = policy_simulator()

    checks = {
        "every call answered 200, on both paths": "ok"
        if all(r[p]["failures"] == 0 for r in rounds for p in ("direct", "gpusched"))
        and image["chat_failures"] == 0
        and serial["failures"] == 0
        else "a call failed (see var/bench-parallel/)",
        f"never more than {PARALLEL} chats in flight at the simulator": "ok"
        if all(r["gpusched"]["most_in_flight"] <= PARALLEL for r in rounds)
        else "more in flight than the slots",
        "no two models ever overlapped at the simulator": "ok"
        if image["overlaps"] == 0 and all(r["gpusched"]["overlaps"] == 0 for r in rounds)
        else "requests of two models overlapped",
    }
    text = report_text(args, machine, rounds, serial, image, comparison, seeds, checks)
    print(text)
    if not args.no_doc:
        harness.write_between_markers(
            DOC_PATH, START, END, heading="## Parallel slots (batchable models)", text=text
        )
    return 0 if all(result == "ok" for result in checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
