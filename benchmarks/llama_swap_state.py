#!/usr/bin/env python
"""How soon an unload at llama-swap shows in `GET /api/gpus/`: `make bench-llama-swap-state`.

On its own database (``gpusched_state``, recreated at every start), the
stack as it runs: the simulator as a process, the GPU's dispatcher cluster
and a web server. Each round loads a model through a job, waits until the
GPU shows it resident, then unloads it at llama-swap
(`POST /api/models/unload/<model>`) and times, from the unload's answer,
until `GET /api/gpus/` (over HTTP, polled every 10 ms) no longer lists it.
Two series: with llama-swap's events flowing, and with them turned off
(the simulator's `POST /sim/events`), where the dispatcher's re-read of
`/running` (queueapp/dispatch/upstream_watch.py, every REREAD_SECONDS)
finds it. The peer is llama-swap itself: its own `GET /running`, read the
same way in the same rounds, shows the unload when its answer comes.

Prints a table and rewrites the "llama-swap as it is" section of docs/benchmarks.md.

    .venv/bin/python benchmarks/llama_swap_state.py              # make bench-llama-swap-state
    .venv/bin/python benchmarks/llama_swap_state.py --rounds 5 --no-doc
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

import harness  # benchmarks/harness.py: database set-up, machine description, percentile
import httpx

ROOT = Path(__file__).resolve().parent.parent
DATABASE = "gpusched_state"
DOC = ROOT / "docs" / "benchmarks.md"
START, END = "<!-- llama-swap-state:start -->", "<!-- llama-swap-state:end -->"
MODEL = "chat"
POLL_SECONDS = 0.01
GOAL_P95_SECONDS = 1.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20, help="unloads per series (default 20)")
    parser.add_argument("--no-doc", dest="doc", action="store_false", help="leave the doc alone")
    return parser.parse_args(argv)


def seconds_until(check, *, timeout: float = 30.0) -> float:
    """Seconds until `check()` is true, polled every POLL_SECONDS."""
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > timeout:
            raise TimeoutError("the unload never showed")
        time.sleep(POLL_SECONDS)
    return time.monotonic() - start


def rounds(
    web_url: str, token: str, sim_url: str, count: int, *, phase: float = 0.0
) -> tuple[list[float], list[float]]:
    """(gpusched's seconds, llama-swap's own) per unload. `phase`: each
    unload waits a random part of it first, so that unloads fall anywhere
    in the re-read's period (back to back, each round would start just
    after a re-read and always wait the whole period)."""
    rng = random.Random(7)
    auth = {"Authorization": f"Bearer {token}"}
    ours, theirs = [], []
    with httpx.Client(timeout=30) as http:

        def resident() -> list[str]:
            (gpu,) = http.get(f"{web_url}/api/gpus/", headers=auth).json()
            return list(gpu["resident_models"])

        def running() -> list[str]:
            return [e["model"] for e in http.get(f"{sim_url}/running").json()["running"]]

        for _ in range(count):
            created = http.post(
                f"{web_url}/api/jobs/",
                json={"path": "/v1/chat/completions", "body": {"model": MODEL, "messages": []}},
                headers=auth,
            )
            created.raise_for_status()
            seconds_until(lambda: resident() == [MODEL])
            time.sleep(rng.uniform(0, phase))
            http.post(f"{sim_url}/api/models/unload/{MODEL}").raise_for_status()
            # Both read right after the unload's answer, alternately.
            start = time.monotonic()
            theirs.append(seconds_until(lambda: MODEL not in running()))
            seconds_until(lambda: resident() == [])
            ours.append(time.monotonic() - start)
    return ours, theirs


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    database_url = harness.fresh_database(DATABASE)
    machine = harness.machine_info()
    from django.db import connection

    from gpusched.stack import Stack
    from queueapp.dispatch.upstream_watch import REREAD_SECONDS
    from queueapp.models import Tier
    from queueapp.services import member_create

    _, token = member_create(name="bench", tier=Tier.objects.get(name="max"))
    connection.close()
    log_dir = Path(tempfile.mkdtemp(prefix="gpusched-bench-state-"))
    print(f"logs: {log_dir}", flush=True)
    series = {}
    with Stack(database_url=database_url, log_dir=log_dir) as stack:
        sim = stack.start_simulator(models={MODEL: 0.01})
        stack.start_cluster()
        web = stack.start_web()
        series["events flowing"] = rounds(web.url, token, sim.url, args.rounds)
        httpx.post(f"{sim.url}/sim/events", json={"enabled": False}).raise_for_status()
        series["events off"] = rounds(web.url, token, sim.url, args.rounds, phase=REREAD_SECONDS)
    text = section(machine, series, args, REREAD_SECONDS)
    print(text)
    if args.doc:
        harness.write_between_markers(
            DOC,
            START,
            END,
            heading="## llama-swap as it is: an unload to `GET /api/gpus/`",
            text=text,
        )
    return 0


def section(machine, series, args, reread: float) -> str:
    rows = []
    for name, (ours, theirs) in series.items():
        p50, p95 = (harness.percentile(ours, q) * 1000 for q in (50, 95))
        peer50, peer95 = (harness.percentile(theirs, q) * 1000 for q in (50, 95))
        rows.append(
            f"| {name} | {p50:.0f} | {p95:.0f} | {max(ours) * 1000:.0f} "
            f"| {peer50:.0f} | {peer95:.0f} |"
        )
    flowing = harness.percentile(series["events flowing"][0], 95)
    off = harness.percentile(series["events off"][0], 95)
    return "\n".join(
        [
            f"{args.rounds} unloads per series (`benchmarks/llama_swap_state.py`): the time "
            "from llama-swap's answer to `POST /api/models/unload/<model>` until "
            "`GET /api/gpus/` no longer lists the model, and, in the same rounds, until "
            "llama-swap's own `GET /running` no longer does. "
            + ", ".join(f"{k} {v}" for k, v in machine.items())
            + ".",
            "",
            "| series | p50 (ms) | p95 (ms) | max (ms) | llama-swap's `/running` p50 (ms) "
            "| its p95 (ms) |",
            "|---|---|---|---|---|---|",
            *rows,
            "",
            f"Goal, events flowing: p95 ≤ {GOAL_P95_SECONDS:g} s: "
            f"{'met' if flowing <= GOAL_P95_SECONDS else 'NOT met'} ({flowing * 1000:.0f} ms). "
            f"Events off: p95 ≤ the re-read interval ({reread:g} s) plus one poll: "
            f"{'met' if off <= reread + 0.5 else 'NOT met'} ({off * 1000:.0f} ms).",
            "",
        ]
    )


if __name__ == "__main__":
    raise SystemExit(main())
