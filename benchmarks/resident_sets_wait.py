#!/usr/bin/env python
"""How long a voice or embedding job waits while a chat runs: `make bench-resident-sets-wait`.

On its own database (``gpusched_sets``, recreated at every start), the
stack as `LLAMA_SWAP_CONFIG=fixtures/llama-swap/studio.yaml make run` runs
it: the simulator as a process serving the studio config, the GPU's
dispatcher cluster reading the same file, and a web server. Each round
starts a chat of CHAT_SECONDS, waits until llama-swap runs it, waits a
random part of a second, then submits a TTS job or an embedding job (in
turn) and times from just before its submission until llama-swap starts
it (the simulator's log: the moment it was admitted, before any load).
Three series in one run:

- gpusched with resident sets (the studio config: chat beside TTS and
  embeddings);
- gpusched with the GPU's `one_model_at_a_time` (the rule before sets);
- the peer, llama-swap alone: the same requests sent straight to it.

Prints a table and rewrites the "Resident sets: a voice job beside a chat"
section of docs/benchmarks.md.

    .venv/bin/python benchmarks/resident_sets_wait.py        # make bench-resident-sets-wait
    .venv/bin/python benchmarks/resident_sets_wait.py --rounds 4 --no-doc
"""

from __future__ import annotations

import argparse
import random
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import harness  # benchmarks/harness.py: database set-up, machine description, percentile
import httpx

ROOT = Path(__file__).resolve().parent.parent
DATABASE = "gpusched_sets"
DOC = ROOT / "docs" / "benchmarks.md"
STUDIO = ROOT / "fixtures" / "llama-swap" / "studio.yaml"
START, END = "<!-- resident-sets-wait:start -->", "<!-- resident-sets-wait:end -->"
CHAT_SECONDS = 2.0
SHORT_SECONDS = 0.2
SWAP_SECONDS = 0.5
POLL_SECONDS = 0.01
GOAL_P95_SECONDS = 0.5
SHORT_MODELS = ("tts-kokoro", "embed-small")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20, help="short jobs per series")
    parser.add_argument("--no-doc", dest="doc", action="store_false", help="leave the doc alone")
    return parser.parse_args(argv)


def body(model: str, seconds: float, label: str) -> dict:
    return {"model": model, "messages": [], "user": label, "sim": {"seconds": seconds}}


class Rounds:
    """The rounds of one series: how a request is sent, and the simulator's log."""

    def __init__(self, sim_url: str, send: Callable[[dict], None]) -> None:
        self.sim_url = sim_url
        self.send = send
        self.http = httpx.Client(timeout=60)

    def started_at(self, label: str) -> float | None:
        for entry in self.http.get(f"{self.sim_url}/sim/log").json():
            if (entry.get("body") or {}).get("user") == label and entry.get("started_at"):
                return float(entry["started_at"])
        return None

    def finished(self, label: str) -> bool:
        return any(
            (entry.get("body") or {}).get("user") == label and entry.get("finished_at")
            for entry in self.http.get(f"{self.sim_url}/sim/log").json()
        )

    def until(self, check: Callable[[], object], *, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() > deadline:
                raise TimeoutError("a job never reached llama-swap")
            time.sleep(POLL_SECONDS)

    def run(self, series: str, count: int) -> list[float]:
        """Seconds from each short job's submission to its start at llama-swap."""
        rng = random.Random(32)
        waits = []
        for index in range(count):
            chat, short = f"{series}-chat-{index}", f"{series}-short-{index}"
            self.send(body("chat-small", CHAT_SECONDS, chat))
            self.until(lambda chat=chat: self.started_at(chat))
            time.sleep(rng.uniform(0.1, 0.6))
            model = SHORT_MODELS[index % len(SHORT_MODELS)]
            sent = time.time()
            self.send(body(model, SHORT_SECONDS, short))
            self.until(lambda short=short: self.started_at(short))
            waits.append(max(0.0, (self.started_at(short) or sent) - sent))
            self.until(lambda chat=chat, short=short: self.finished(chat) and self.finished(short))
        return waits


def through_gpusched(web_url: str, token: str) -> Callable[[dict], None]:
    http = httpx.Client(timeout=30, headers={"Authorization": f"Bearer {token}"})

    def send(request: dict) -> None:
        answer = http.post(
            f"{web_url}/api/jobs/", json={"path": "/v1/chat/completions", "body": request}
        )
        answer.raise_for_status()

    return send


def straight_to(sim_url: str) -> Callable[[dict], None]:
    """llama-swap alone: each request from a thread of its own (its answer
    comes when the job ends), on one client's kept-alive connections, as
    gpusched's are."""
    http = httpx.Client(timeout=60, limits=httpx.Limits(max_keepalive_connections=4))
    http.get(f"{sim_url}/health")  # the connection opened before the first round

    def send(request: dict) -> None:
        threading.Thread(
            target=lambda: http.post(f"{sim_url}/v1/chat/completions", json=request),
            daemon=True,
        ).start()

    return send


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    database_url = harness.fresh_database(DATABASE)
    machine = harness.machine_info()
    from django.db import connection

    from gpusched.stack import Stack, wait_for
    from queueapp.models import Gpu, Tier
    from queueapp.services import member_create

    _, token = member_create(name="bench", tier=Tier.objects.get(name="max"))
    connection.close()
    log_dir = Path(tempfile.mkdtemp(prefix="gpusched-bench-sets-"))
    print(f"logs: {log_dir}", flush=True)
    series: dict[str, list[float]] = {}
    with Stack(database_url=database_url, log_dir=log_dir) as stack:
        sim = stack.start_simulator(models={}, swap_seconds=SWAP_SECONDS, config=STUDIO)
        stack.start_cluster(LLAMA_SWAP_CONFIG=str(STUDIO))
        web = stack.start_web()
        wait_for(lambda: Gpu.objects.filter(routing__isnull=False).exists(), message="routing")
        gpusched = Rounds(sim.url, through_gpusched(web.url, token))
        series["gpusched, resident sets"] = gpusched.run("sets", args.rounds)
        Gpu.objects.update(one_model_at_a_time=True)
        connection.close()
        series["gpusched, one model at a time"] = gpusched.run("one", args.rounds)
        series["llama-swap alone (peer)"] = Rounds(sim.url, straight_to(sim.url)).run(
            "alone", args.rounds
        )
    text = section(machine, series, args)
    print(text)
    if args.doc:
        harness.write_between_markers(
            DOC,
            START,
            END,
            heading="## Resident sets: a voice or embedding job beside a chat",
            text=text,
        )
    return 0


def section(machine: dict[str, str], series: dict[str, list[float]], args) -> str:
    rows = [
        f"| {name} | {harness.percentile(waits, 50) * 1000:.0f} "
        f"| {harness.percentile(waits, 95) * 1000:.0f} | {max(waits) * 1000:.0f} |"
        for name, waits in series.items()
    ]
    ours = harness.percentile(series["gpusched, resident sets"], 95)
    return "\n".join(
        [
            f"{args.rounds} rounds per series (`benchmarks/resident_sets_wait.py`), on the "
            "studio config (fixtures/llama-swap/studio.yaml) served by the simulator as a "
            f"process: a chat of {CHAT_SECONDS:g} s runs, and 0.1-0.6 s into it a TTS or an "
            f"embedding job of {SHORT_SECONDS:g} s is submitted; its wait runs from just "
            "before the submission until llama-swap admits it (before any load, "
            f"{SWAP_SECONDS:g} s here). " + ", ".join(f"{k} {v}" for k, v in machine.items()) + ".",
            "",
            "| series | wait p50 (ms) | wait p95 (ms) | max (ms) |",
            "|---|---|---|---|",
            *rows,
            "",
            f"Goal: p95 ≤ {GOAL_P95_SECONDS:g} s with resident sets: "
            f"{'met' if ours <= GOAL_P95_SECONDS else 'NOT met'} ({ours * 1000:.0f} ms).",
            "",
        ]
    )


if __name__ == "__main__":
    raise SystemExit(main())
