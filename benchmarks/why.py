#!/usr/bin/env python
"""How long `why` takes for a job that waited behind 500 decisions: `make bench-why`.

On its own database (``gpusched_why``, recreated at every start) the
benchmark writes a day of two GPUs as rows, as tests/why/timeline.py writes
its histories: jobs, their dispatch decisions (terms, the leading
candidates, the policy, skip reasons, the idle reason after a gap), their
`started` and `succeeded` events. gpu0 serves the studio's voice and
picture sets, chat in 4 parallel slots; gpu1 runs images, videos and chat
in slots too; now and then an image is cut by an unload and runs again, and
now and then a GPU stands idle. Two jobs wait behind exactly WAITED_BEHIND
decisions of the other jobs on both GPUs:

- *finished*: an image that then ran on gpu0 and succeeded;
- *queued*: a video still queued now, beside a few other queued jobs.

`queueapp.why.job_why` is timed for each, in a process of its own per
checkout, against the same database in the same run: this checkout, and the
code before the wait was cut once (commit BEFORE, extracted with `git
archive` into a temporary folder first on the process's path, removed
afterwards). Each process calls `job_why` a few times unmeasured, then
CALLS times per job, in ROUNDS rounds that alternate the two checkouts so
that the host's drift falls on both alike. When this checkout's p50 misses
the goal, a cProfile of it is printed.

Prints a table and rewrites the latest run in docs/benchmarks.md's "Why
the wait adds up: the goals" (between its markers; the goals table above
them is kept by hand).

    .venv/bin/python benchmarks/why.py              # make bench-why
    .venv/bin/python benchmarks/why.py --calls 20 --no-doc
    .venv/bin/python benchmarks/why.py --history 2 --no-doc   # twice the history before
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import harness  # benchmarks/harness.py: database set-up, machine description, percentile

ROOT = Path(__file__).resolve().parent.parent
DATABASE = "gpusched_why"
DOC = ROOT / "docs" / "benchmarks.md"
START, END = "<!-- why:start -->", "<!-- why:end -->"
BEFORE = "9ed4e8f"  # the code before the wait was cut once (60c447c)
GOAL_P50_MS = 50.0
WAITED_BEHIND = 500
# The GPUs' work before the two jobs arrived.
HISTORY_BEFORE_HOURS = 1.0
CHAT_SLOTS = 4
POLICY = {"aging_divisor": 60.0, "swap_affinity_bonus": 10.0, "band_spacing": 100}
NOTHING_SKIPPED: dict[str, Any] = {"skipped": {}, "left_out": {}, "capped_members": []}
# name, tier: the members who send the day's work.
MEMBERS = [
    ("ann", "pro"),
    ("bob", "free"),
    ("cat", "max"),
    ("dan", "free"),
    ("eve", "pro"),
    ("fay", "free"),
    ("gus", "max"),
    ("hal", "pro"),
]
TIER_BONUS = {"free": 0, "pro": 1, "max": 2}
PATHS = {
    "chat-small": "/v1/chat/completions",
    "tts-kokoro": "/v1/audio/speech",
    "embed-small": "/v1/embeddings",
    "image-xl": "/v1/images/generations",
    "video-wan": "/v1/images/generations",
}
WARM_CALLS = 3
PROFILE_CALLS = 10


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=50, help="timed calls per job and checkout")
    parser.add_argument("--rounds", type=int, default=2, help="turns of each checkout")
    parser.add_argument("--seed", type=int, default=32)
    parser.add_argument(
        "--history",
        type=float,
        default=HISTORY_BEFORE_HOURS,
        help="hours of the GPUs' work before the two jobs arrived",
    )
    parser.add_argument("--no-doc", dest="doc", action="store_false", help="leave the doc alone")
    # The timing process: one checkout's code against the database built.
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tree", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--jobs", help=argparse.SUPPRESS)
    parser.add_argument("--profile", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


# -- the day, as rows ----------------------------------------------------------------------


@dataclass
class Run:
    """One dispatch on a GPU: the job's start (its decision) and end, in
    seconds from the day's zero; `cut`: llama-swap's unload ended it and the
    job went back to the queue (it runs again later)."""

    gpu: str
    model: str
    member: str
    band: int
    start: float
    end: float
    slot: int = 0
    in_flight: int = 1
    swap: bool = False
    resident: str = ""
    idle_since: float | None = None
    cut: bool = False
    job_key: int = 0  # runs of one job share it


@dataclass
class Day:
    runs: list[Run] = field(default_factory=list)
    keys: int = 0

    def key(self) -> int:
        self.keys += 1
        return self.keys


class GpuDay:
    """One GPU's work, phase after phase: a model's jobs, then a drain and
    the swap to the next model's."""

    def __init__(
        self, day: Day, name: str, phases: list[str], draw: random.Random, since: float
    ) -> None:
        self.day, self.name, self.phases, self.draw = day, name, phases, draw
        self.clock = -since
        self.resident = ""

    def member(self) -> tuple[str, str]:
        return self.draw.choice(MEMBERS)

    def _start(self, run: Run) -> Run:
        run.swap = run.model != self.resident
        run.resident = "" if run.swap else self.resident
        self.resident = run.model
        self.day.runs.append(run)
        return run

    def _idle_first(self) -> float | None:
        """Now and then the GPU stands idle before its next phase."""
        if self.draw.random() < 0.1:
            since = self.clock
            self.clock += self.draw.uniform(1.0, 5.0)
            return since
        return None

    def phase(self) -> None:
        kind = self.draw.choice(self.phases)
        since = self._idle_first()
        if kind == "chat":
            self._chats(since)
        else:
            self._one_at_a_time(kind, since)
        self.clock += 0.02  # the dispatch pass after the last end

    def _chats(self, since: float | None) -> None:
        """Chats in parallel slots: each slot takes the next chat as its
        last ends; the phase ends when the slowest has drained."""
        free = [self.clock] * CHAT_SLOTS
        for index in range(self.draw.randint(6, 24)):
            slot = min(range(CHAT_SLOTS), key=lambda s: free[s])
            # One claim at a time: a phase's first chats start a few ms apart.
            start = free[slot] + 0.01 + 0.003 * slot
            end = start + self.draw.uniform(1.5, 7.0)
            in_flight = 1 + sum(1 for other in free if other > start)
            name, tier = self.member()
            self._start(
                Run(
                    self.name,
                    "chat-small",
                    name,
                    100 if index % 7 == 0 else 0,
                    start,
                    end,
                    slot=slot,
                    in_flight=in_flight,
                    idle_since=since if index == 0 else None,
                    job_key=self.day.key(),
                )
            )
            free[slot] = end
        self.clock = max(free)

    def _one_at_a_time(self, model: str, since: float | None) -> None:
        seconds, count, band = {
            "image-xl": ((3.0, 8.0), (1, 3), 0),
            "video-wan": ((15.0, 40.0), (1, 1), -100),
            "tts-kokoro": ((0.3, 2.0), (1, 4), 100),
            "embed-small": ((0.1, 0.5), (1, 6), 0),
        }[model]
        for index in range(self.draw.randint(*count)):
            name, _ = self.member()
            key = self.day.key()
            start = self.clock + 0.01
            if model == "image-xl" and self.draw.random() < 0.05:
                # Cut by an unload: it goes back to the queue and runs again next.
                cut_at = start + self.draw.uniform(0.5, 2.0)
                self._start(Run(self.name, model, name, band, start, cut_at, cut=True, job_key=key))
                self.resident = ""
                start = cut_at + 0.3
            end = start + self.draw.uniform(*seconds)
            self._start(
                Run(
                    self.name,
                    model,
                    name,
                    band,
                    start,
                    end,
                    idle_since=since if index == 0 else None,
                    job_key=key,
                )
            )
            self.clock = end


def the_day(seed: int, history_hours: float) -> tuple[Day, float, float]:
    """Both GPUs' runs, the moment the two jobs arrive (after which exactly
    WAITED_BEHIND decisions were taken before the finished one started) and
    the finished one's start on gpu0."""
    draw = random.Random(seed)
    day = Day()
    since = history_hours * 3600
    gpu0_phases = ["chat", "chat", "tts-kokoro", "embed-small", "image-xl"]
    gpu0 = GpuDay(day, "gpu0", gpu0_phases, draw, since)
    gpu1 = GpuDay(day, "gpu1", ["chat", "image-xl", "image-xl", "video-wan"], draw, since)
    while True:
        # gpu1 runs ahead of gpu0, so its decisions up to gpu0's clock are known.
        while gpu1.clock <= gpu0.clock + 60:
            gpu1.phase()
        gpu0.phase()
        start = gpu0.clock + 0.01
        behind = sorted(run.start for run in day.runs if 0 < run.start < start)
        if len(behind) > WAITED_BEHIND:
            break
    # The arrival moves up to leave exactly WAITED_BEHIND decisions in the wait.
    first, after = behind[-WAITED_BEHIND - 1], behind[-WAITED_BEHIND]
    if not first < after:
        raise RuntimeError("two decisions at one instant where the wait should begin")
    return day, (first + after) / 2, start


def build(seed: int, history_hours: float) -> dict[str, Any]:
    """The day's rows; returns the two jobs' ids and what was written."""
    from django.db import transaction

    from queueapp import services
    from queueapp.models import DispatchDecision, GpuIdle, Job, JobEvent, JobStatus, Tier
    from queueapp.selectors import db_now

    day, arrival, finished_start = the_day(seed, history_hours)
    last_end = max(run.end for run in day.runs)
    # Every run has ended a minute before now; the queued job waits on.
    zero = db_now() - timedelta(seconds=max(last_end, finished_start + 10) + 60)

    def at(second: float) -> datetime:
        return zero + timedelta(seconds=second)

    gpus = {
        name: services.gpu_register(name=name, url=f"http://127.0.0.1:9/{name}")
        for name in ("gpu0", "gpu1")
    }
    services.model_parallel_set(name="chat-small", parallel=CHAT_SLOTS)
    tiers = {tier.name: tier for tier in Tier.objects.all()}
    members = {
        name: services.member_create(name=name, tier=tiers[tier])[0] for name, tier in MEMBERS
    }
    waiter = services.member_create(name="wendy", tier=tiers["free"])[0]
    queuer = services.member_create(name="quinn", tier=tiers["pro"])[0]
    tier_of = dict(MEMBERS)

    by_key: dict[int, list[Run]] = {}
    for run in day.runs:
        by_key.setdefault(run.job_key, []).append(run)
    with transaction.atomic():
        jobs = []
        for key, runs in by_key.items():
            first, last = runs[0], runs[-1]
            submitted = first.start - random.Random(key).uniform(0.5, 30.0)
            jobs.append(
                Job(
                    member=members[first.member],
                    path=PATHS[first.model],
                    body={"model": first.model, "input": "…"},
                    model=first.model,
                    priority_requested=first.band,
                    priority=first.band,
                    status=JobStatus.SUCCEEDED,
                    submitted_at=at(submitted),
                    eligible_at=at(submitted),
                    rank_key=0.0,
                    started_at=at(last.start),
                    finished_at=at(last.end),
                    gpu=gpus[last.gpu],
                    gpu_slot=last.slot,
                    attempts=len(runs),
                )
            )
        created = Job.objects.bulk_create(jobs, batch_size=2000)
        job_of = {key: job for key, job in zip(by_key, created, strict=True)}
        decisions, events = [], []
        for run in sorted(day.runs, key=lambda r: r.start):
            job = job_of[run.job_key]
            decisions.append(DispatchDecision(**decision_fields(run, job, at, gpus, tier_of)))
            events.append(
                JobEvent(
                    job=job,
                    kind=JobEvent.Kind.STARTED,
                    at=at(run.start),
                    detail={"gpu": run.gpu},
                )
            )
            if run.cut:
                events.append(
                    JobEvent(
                        job=job,
                        kind=JobEvent.Kind.RETURNED_TO_QUEUE,
                        at=at(run.end),
                        detail={"reason": "unloaded", "cut_by_unload": True},
                    )
                )
            else:
                events.append(JobEvent(job=job, kind=JobEvent.Kind.SUCCEEDED, at=at(run.end)))
        DispatchDecision.objects.bulk_create(decisions, batch_size=2000)
        JobEvent.objects.bulk_create(events, batch_size=5000)

    finished = services.job_submit(
        member=waiter,
        path=PATHS["image-xl"],
        body={"model": "image-xl", "prompt": "a fox in the snow"},
        model="image-xl",
        priority_header=None,
    )
    Job.objects.filter(pk=finished.pk).update(
        submitted_at=at(arrival),
        eligible_at=at(arrival),
        status=JobStatus.SUCCEEDED,
        started_at=at(finished_start),
        finished_at=at(finished_start + 5.0),
        gpu=gpus["gpu0"],
        is_lane_head=False,
    )
    finished = Job.objects.get(pk=finished.pk)
    DispatchDecision.objects.create(
        **decision_fields(
            Run("gpu0", "image-xl", "wendy", 0, finished_start, finished_start + 5.0, swap=True),
            finished,
            at,
            gpus,
            {"wendy": "free"},
        )
    )
    JobEvent.objects.create(job=finished, kind=JobEvent.Kind.SUCCEEDED, at=at(finished_start + 5))

    queued = services.job_submit(
        member=queuer,
        path=PATHS["video-wan"],
        body={"model": "video-wan", "prompt": "a fox in the snow", "num_frames": 81},
        model="video-wan",
        priority_header="batch",
    )
    Job.objects.filter(pk=queued.pk).update(submitted_at=at(arrival), eligible_at=at(arrival))
    # A few other jobs queued beside it, and both GPUs idle since their last end.
    for index, (name, _) in enumerate(MEMBERS[:6]):
        services.job_submit(
            member=members[name],
            path=PATHS["image-xl"],
            body={"model": "image-xl", "prompt": f"shot {index}"},
            model="image-xl",
            priority_header="batch",
        )
    for name, gpu in gpus.items():
        ended = max(
            [run.end for run in day.runs if run.gpu == name]
            + ([finished_start + 5] if name == "gpu0" else [])
        )
        GpuIdle.objects.create(gpu=gpu, since=at(ended), at=db_now(), skips=NOTHING_SKIPPED)
    harness.sql_execute(
        "VACUUM ANALYZE queueapp_job, queueapp_dispatchdecision, queueapp_jobevent, "
        "queueapp_member, queueapp_tier"
    )
    behind = DispatchDecision.objects.filter(at__gt=at(arrival), at__lt=at(finished_start)).count()
    return {
        "finished": finished.pk,
        "queued": queued.pk,
        "jobs": Job.objects.count(),
        "decisions": DispatchDecision.objects.count(),
        "events": JobEvent.objects.count(),
        "behind": behind,
        "behind_gpu0": DispatchDecision.objects.filter(
            gpu=gpus["gpu0"], at__gt=at(arrival), at__lt=at(finished_start)
        ).count(),
        "wait_seconds": round(finished_start - arrival, 1),
        "slots_shared": DispatchDecision.objects.filter(in_flight__gt=1).count(),
        "cut": sum(run.cut for run in day.runs),
        "waiter": waiter.pk,
    }


def decision_fields(run: Run, job: Any, at: Any, gpus: dict, tier_of: dict) -> dict[str, Any]:
    bonus = TIER_BONUS[tier_of[run.member]]
    affinity = 0.0 if run.swap else POLICY["swap_affinity_bonus"]
    waited = max(0.0, (at(run.start) - job.submitted_at).total_seconds())
    aging = waited / POLICY["aging_divisor"]
    terms = {
        "band": run.band,
        "tier_bonus": bonus,
        "swap_affinity": affinity,
        "aging": round(aging, 4),
        "effective": round(run.band + bonus + affinity + aging, 4),
        "waited_seconds": round(waited, 3),
        "aged_seconds": round(waited, 3),
    }
    leading = [{"job_id": job.pk, "model": run.model} | terms] + [
        {"job_id": job.pk + n, "model": "image-xl"} | terms | {"effective": terms["effective"] - n}
        for n in range(1, 5)
    ]
    idle = run.start - run.idle_since if run.idle_since is not None else None
    return {
        "at": at(run.start),
        "job": job,
        "gpu": gpus[run.gpu],
        "band": run.band,
        "terms": terms,
        "candidates": leading,
        "resident_model": run.resident,
        "swap_needed": run.swap,
        "swap": {"loads": run.model, "unloads": []} if run.swap else None,
        "policy": POLICY,
        "counterfactuals": {
            term: {"winner": job.pk, "changed": False}
            for term in ("aging", "swap_affinity", "tier_bonus", "fairness")
        },
        "idle_seconds": idle,
        "gpu_slot": run.slot,
        "in_flight": run.in_flight,
        "skips": NOTHING_SKIPPED,
        "idle_reason": (
            {"since": at(run.idle_since).isoformat(), "skips": NOTHING_SKIPPED}
            if run.idle_since is not None
            else None
        ),
    }


# -- the timing, in a process of one checkout ----------------------------------------------


def measure(args: argparse.Namespace) -> int:
    """Time `job_why` with the code of `args.tree` (first on the path) for
    each job of `args.jobs`; print one JSON line."""
    sys.path.insert(0, str(args.tree.resolve()))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpusched.settings")
    import django

    django.setup()
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    import queueapp.why
    from queueapp.models import Job
    from queueapp.why import job_why

    cases = dict(case.split("=") for case in args.jobs.split(","))
    result: dict[str, Any] = {"code": str(Path(queueapp.why.__file__).parent), "cases": {}}

    def call(pk: int) -> dict[str, Any]:
        job = Job.objects.select_related("member__tier").get(pk=pk)
        answer: dict[str, Any] = job_why(job=job, viewer=job.member)
        return answer

    for case, pk in cases.items():
        for _ in range(WARM_CALLS):
            call(int(pk))
        if args.profile:
            import cProfile
            import pstats

            profile = cProfile.Profile()
            profile.enable()
            for _ in range(PROFILE_CALLS):
                call(int(pk))
            profile.disable()
            print(f"-- cProfile of {PROFILE_CALLS} calls, {case}, by own time", file=sys.stderr)
            pstats.Stats(profile, stream=sys.stderr).sort_stats("tottime").print_stats(15)
            print("-- the same, queueapp/why's functions by cumulative time", file=sys.stderr)
            stats = pstats.Stats(profile, stream=sys.stderr).sort_stats("cumulative")
            stats.print_stats(r"queueapp/why/", 25)
            continue
        timings = []
        for _ in range(args.calls):
            job = Job.objects.select_related("member__tier").get(pk=int(pk))
            began = time.perf_counter()
            job_why(job=job, viewer=job.member)
            timings.append((time.perf_counter() - began) * 1000)
        with CaptureQueriesContext(connection) as queries:
            answer = call(int(pk))
        counted = sum(p["seconds"] + p.get("swap_seconds", 0.0) for p in answer["parts"])
        result["cases"][case] = {
            "ms": timings,
            "queries": len(queries),
            "parts": len(answer["parts"]),
            "wait": answer["measured_wait_seconds"],
            "parts_total": round(counted, 3),
            "adds_up": abs(counted - answer["measured_wait_seconds"]) <= 0.0015
            and answer.get("adds_up", True),
        }
    print(json.dumps(result))
    return 0


def extracted(commit: str) -> Path:
    """The code of `commit` (queueapp and gpusched) in a temporary folder."""
    folder = Path(tempfile.mkdtemp(prefix=f"gpusched-why-{commit}-"))
    archive = subprocess.run(
        ["git", "archive", commit, "queueapp", "gpusched"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    return folder


def timed_in(tree: Path, database_url: str, jobs: str, calls: int, profile: bool = False) -> dict:
    env = dict(os.environ, DATABASE_URL=database_url, PYTHONUNBUFFERED="1")
    env.pop("PYTHONPATH", None)
    argv = [sys.executable, __file__, "--measure", "--tree", str(tree), "--jobs", jobs]
    argv += ["--calls", str(calls)] + (["--profile"] if profile else [])
    done = subprocess.run(argv, env=env, cwd=tree, capture_output=True, text=True)
    if profile:
        return {"profile": done.stderr}
    if done.returncode:
        raise RuntimeError(f"the timing process for {tree} failed:\n{done.stderr[-4000:]}")
    found: dict = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.measure:
        return measure(args)
    database_url = harness.fresh_database(DATABASE)
    machine = harness.machine_info()
    began = time.monotonic()
    built = build(args.seed, args.history)
    print(
        f"built in {time.monotonic() - began:.1f} s: {built['jobs']} jobs, "
        f"{built['decisions']} decisions, {built['events']} events; the waits are behind "
        f"{built['behind']} decisions ({built['behind_gpu0']} on gpu0)",
        flush=True,
    )
    from django.db import connection

    connection.close()
    jobs = f"finished={built['finished']},queued={built['queued']}"
    before_tree = extracted(BEFORE)
    trees = {"this code": ROOT, f"before ({BEFORE})": before_tree}
    series: dict[str, dict[str, dict[str, Any]]] = {name: {} for name in trees}
    per_round = max(1, args.calls // args.rounds)
    try:
        for round_ in range(args.rounds):
            order = list(trees.items())
            for name, tree in order if round_ % 2 == 0 else reversed(order):
                found = timed_in(tree, database_url, jobs, per_round)
                assert Path(found["code"]).is_relative_to(tree.resolve()), (found["code"], tree)
                for case, figures in found["cases"].items():
                    into = series[name].setdefault(case, {**figures, "ms": []})
                    into["ms"] += figures["ms"]
                    into["adds_up"] = into["adds_up"] and figures["adds_up"]
                print(f"round {round_ + 1}: {name} timed", flush=True)
        ours = harness.percentile(series["this code"]["finished"]["ms"], 50)
        profile = ""
        if ours > GOAL_P50_MS:
            profile = timed_in(ROOT, database_url, jobs, 0, profile=True)["profile"]
            print(profile)
    finally:
        shutil.rmtree(before_tree, ignore_errors=True)
    text = section(machine, built, series, args)
    print(text)
    if args.doc:
        harness.write_between_markers(
            DOC, START, END, heading="## Why the wait adds up: the latest run", text=text
        )
    return 0


def section(
    machine: dict[str, str],
    built: dict[str, Any],
    series: dict[str, dict[str, dict[str, Any]]],
    args: argparse.Namespace,
) -> str:
    rows = []
    for name, cases in series.items():
        for case, figures in cases.items():
            ms = figures["ms"]
            rows.append(
                f"| {name} | {case} | {harness.percentile(ms, 50):.1f} "
                f"| {harness.percentile(ms, 95):.1f} | {max(ms):.1f} | {figures['queries']} "
                f"| {figures['parts']} | {figures['wait']:.3f} / {figures['parts_total']:.3f} "
                f"| {'yes' if figures['adds_up'] else '**no**'} |"
            )
    ours = harness.percentile(series["this code"]["finished"]["ms"], 50)
    calls = len(series["this code"]["finished"]["ms"])
    return "\n".join(
        [
            f"`make bench-why` (`benchmarks/why.py`, seed {args.seed}): two GPUs' work "
            f"written as rows, {args.history:g} h of it before the two jobs below arrived "
            f"({built['jobs']:,} jobs, {built['decisions']:,} dispatch "
            f"decisions, {built['events']:,} events; gpu0 chat in {CHAT_SLOTS} parallel slots, "
            f"TTS, embeddings and images, gpu1 images, videos and chat in slots; "
            f"{built['slots_shared']:,} starts beside other jobs, {built['cut']} images cut by "
            "an unload and run again, idle gaps with their kept reasons). Two jobs arrived "
            f"together and waited behind {built['behind']} decisions "
            f"({built['behind_gpu0']} on gpu0): an image that then ran on gpu0 (*finished*, a "
            f"wait of {built['wait_seconds']:g} s) and a video still queued (*queued*, beside "
            f"6 other queued jobs). `job_why` timed {calls} times per job and checkout, "
            f"after {WARM_CALLS} calls unmeasured, in {args.rounds} rounds that alternate "
            f"the checkouts, each in a process of its own on the same database: this "
            f"checkout and the code before the wait was cut once ({BEFORE}, `git archive` "
            "into a temporary folder). " + ", ".join(f"{k} {v}" for k, v in machine.items()) + ".",
            "",
            "| code | job | p50 (ms) | p95 (ms) | max (ms) | queries | parts "
            "| wait / parts (s) | parts add up |",
            "|---|---|---|---|---|---|---|---|---|",
            *rows,
            "",
            f"Goal: p50 ≤ {GOAL_P50_MS:g} ms for the finished job: "
            f"{'met' if ours <= GOAL_P50_MS else 'NOT met'} ({ours:.1f} ms).",
            "",
        ]
    )


if __name__ == "__main__":
    raise SystemExit(main())
