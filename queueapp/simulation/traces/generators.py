"""The workloads of fixtures/traces/, generated from a seed: Poisson streams of
jobs from the studio's members, and chains a client submits one unit at a time.
The same seed writes the same files (tests/simulation/test_traces.py)."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from queueapp.simulation.traces import HOUR, Trace, TraceJob, dump_trace
from queueapp.simulation.traces.sizes import with_sizes

IMAGE_MODEL = "image-xl"
VIDEO_MODEL = "video-wan"
CHAT_MODEL = "chat-small"
TTS_MODEL = "tts-kokoro"
EMBED_MODEL = "embed-small"


def _poisson_times(
    rng: random.Random, rate_per_hour: float, start: float, end: float
) -> list[float]:
    times: list[float] = []
    t = start
    while True:
        t += rng.expovariate(rate_per_hour / HOUR)
        if t >= end:
            return times
        times.append(round(t, 1))


@dataclass(frozen=True)
class Stream:
    """Poisson arrivals of one kind of job from a set of members."""

    kind: str
    priority: str | None
    model: str
    rate_per_hour: float
    seconds: tuple[float, float]  # uniform run time between these
    members: tuple[str, ...]


def _streams(
    rng: random.Random, streams: Iterable[Stream], start: float, end: float
) -> list[TraceJob]:
    jobs = []
    for stream in streams:
        for at in _poisson_times(rng, stream.rate_per_hour, start, end):
            jobs.append(
                TraceJob(
                    id="",
                    member=rng.choice(stream.members),
                    priority=stream.priority,
                    model=stream.model,
                    seconds=round(rng.uniform(*stream.seconds), 1),
                    kind=stream.kind,
                    at=at,
                )
            )
    jobs.sort(key=lambda job: job.at or 0.0)  # every job of a stream has its arrival time
    return [_named(job, f"{job.kind}-{n:04d}") for n, job in enumerate(jobs, 1)]


def _named(job: TraceJob, name: str) -> TraceJob:
    return TraceJob(**{**asdict(job), "id": name})


def _chain(
    *, name: str, member: str, priority: str, model: str, units: int, seconds: float,
    first_at: float, rng: random.Random, kind: str,
) -> list[TraceJob]:  # fmt: skip
    """A client producing `units` one at a time: the next is submitted a few
    seconds (its polling interval) after the previous one finished."""
    jobs: list[TraceJob] = []
    for index in range(1, units + 1):
        placement: dict[str, Any] = (
            {"at": first_at}
            if index == 1
            else {"after": jobs[-1].id, "delay": round(rng.uniform(2.0, 8.0), 1)}
        )
        jobs.append(
            TraceJob(
                id=f"{name}-{index:03d}",
                member=member,
                priority=priority,
                model=model,
                seconds=seconds,
                kind=kind,
                chain=name,
                **placement,
            )
        )
    return jobs


STUDIO_MEMBERS = {
    "ava": "free",
    "ben": "free",
    "cai": "free",
    "dara": "pro",
    "eli": "pro",
    "fen": "pro",
    "gus": "max",
    "hana": "max",
    "mira": "max",
}
# llama-swap's per-model priority as an operator would set it for this studio:
# quick tool calls and images before video renders.
STUDIO_MODEL_PRIORITY = {CHAT_MODEL: 2, IMAGE_MODEL: 1, VIDEO_MODEL: 0}


def _studio_streams(rng: random.Random, busier: float) -> list[TraceJob]:
    everyone = tuple(STUDIO_MEMBERS)
    streams = [
        Stream("image", "interactive", IMAGE_MODEL, 30.0 * busier, (5.0, 40.0), everyone),
        Stream("video", "interactive", VIDEO_MODEL, 0.5 * busier, (240.0, 960.0), everyone),
        Stream("tool", "normal", CHAT_MODEL, 30.0 * busier, (2.0, 10.0), everyone),
    ]
    return _streams(rng, streams, 0.0, 24 * HOUR)


def _film(rng: random.Random, *, name: str, member: str, first_at: float) -> list[TraceJob]:
    return _chain(
        name=name, member=member, priority="batch", model=VIDEO_MODEL, units=174,
        seconds=240.0, first_at=first_at, rng=rng, kind="film-shot",
    )  # fmt: skip


def _with_chains(jobs: list[TraceJob], chains: Iterable[list[TraceJob]]) -> tuple[TraceJob, ...]:
    """Arrivals by time (each chain's first unit among them), then the units
    that follow another."""
    chains = list(chains)
    firsts = [chain[0] for chain in chains]
    rest = [unit for chain in chains for unit in chain[1:]]
    return tuple(sorted(jobs + firsts, key=lambda job: job.at or 0.0)) + tuple(rest)


def studio_day(seed: int, *, busier: float = 1.0, film_at_once: bool = False) -> Trace:
    """`busier` multiplies the arrival rates of everything but the film, and
    `film_at_once` queues all its shots at hour 1 (the report's variants; the
    committed trace is neither)."""
    rng = random.Random(seed)
    jobs = _studio_streams(rng, busier)
    film = _film(rng, name="film", member="mira", first_at=1 * HOUR)
    if film_at_once:
        film = [replace(shot, at=1 * HOUR, after=None, delay=0.0) for shot in film]
    return Trace(
        name="studio-day",
        description=(
            "24 hours of a studio sharing one GPU around the clock: interactive images "
            "(5-40 s) and videos (4-16 min) and normal tool calls from nine members of "
            "three tiers, and mira's film of 174 four-minute shots produced one at a time "
            "from hour 1"
        ),
        seed=seed,
        jobs=_with_chains(jobs, [film]),
        members=dict(STUDIO_MEMBERS),
        swap_seconds=10.0,
        duration_seconds=24 * HOUR,
        model_priority=dict(STUDIO_MODEL_PRIORITY),
    )


def studio_day_two_gpus(seed: int) -> Trace:
    """The studio day grown for two GPUs: twice its arrivals and a second film,
    so each GPU carries about the load the one GPU carries on the studio day."""
    rng = random.Random(seed)
    jobs = _studio_streams(rng, busier=2.0)
    films = [
        _film(rng, name="film", member="mira", first_at=1 * HOUR),
        _film(rng, name="sequel", member="gus", first_at=2 * HOUR),
    ]
    return Trace(
        name="studio-day-2gpu",
        description=(
            "24 hours of a studio twice as busy sharing two GPUs: interactive images "
            "(5-40 s) and videos (4-16 min) and normal tool calls at twice the studio "
            "day's rates, mira's film of 174 four-minute batch shots from hour 1 and "
            "gus's sequel of 174 from hour 2, each produced one shot at a time"
        ),
        seed=seed,
        jobs=_with_chains(jobs, films),
        members=dict(STUDIO_MEMBERS),
        swap_seconds=10.0,
        duration_seconds=24 * HOUR,
        model_priority=dict(STUDIO_MODEL_PRIORITY),
    )


def flood(seed: int) -> Trace:
    rng = random.Random(seed)
    members = dict(STUDIO_MEMBERS)
    everyone = tuple(members)
    background = _streams(
        rng,
        [
            Stream("image", "interactive", IMAGE_MODEL, 20.0, (5.0, 40.0), everyone),
            Stream("tool", "normal", CHAT_MODEL, 20.0, (2.0, 10.0), everyone),
        ],
        0.0,
        4 * HOUR,
    )
    shots = []
    for member, count, at in (("ava", 200, 60.0), ("dara", 5, 660.0), ("ben", 5, 1260.0)):
        for index in range(1, count + 1):
            shots.append(
                TraceJob(
                    id=f"shot-{member}-{index:03d}",
                    member=member,
                    priority="batch",
                    model=IMAGE_MODEL,
                    seconds=round(rng.uniform(30.0, 60.0), 1),
                    kind="batch-shot",
                    at=at,
                )
            )
    return Trace(
        name="flood",
        description=(
            "ava (free) submits 200 batch image shots at once; 10 minutes later dara (pro) "
            "submits 5, 10 minutes after that ben (free) 5; interactive images and tool "
            "calls keep arriving for 4 hours"
        ),
        seed=seed,
        jobs=tuple(sorted(background + shots, key=lambda job: job.at or 0.0)),
        members=members,
        swap_seconds=10.0,
        duration_seconds=4 * HOUR,
        model_priority=dict(STUDIO_MODEL_PRIORITY),
    )


def swap_heavy(seed: int) -> Trace:
    rng = random.Random(seed)
    members = {name: tier for name, tier in STUDIO_MEMBERS.items() if name != "mira"}
    everyone = tuple(members)
    jobs = _streams(
        rng,
        [
            Stream("tool", "normal", CHAT_MODEL, 90.0, (2.0, 10.0), everyone),
            Stream("image", "normal", IMAGE_MODEL, 30.0, (10.0, 30.0), everyone),
            Stream("clip", "normal", VIDEO_MODEL, 4.0, (60.0, 180.0), everyone),
            Stream("image", "interactive", IMAGE_MODEL, 10.0, (5.0, 20.0), everyone),
        ],
        0.0,
        4 * HOUR,
    )
    return Trace(
        name="swap-heavy",
        description=(
            "4 hours of a mix of three models in about equal GPU shares (tool calls, "
            "images, short video clips), mostly normal priority, with a 30 s swap"
        ),
        seed=seed,
        jobs=tuple(jobs),
        members=members,
        swap_seconds=30.0,
        duration_seconds=4 * HOUR,
        model_priority=dict(STUDIO_MODEL_PRIORITY),
    )


def studio_sets(seed: int) -> Trace:
    """The models of fixtures/llama-swap/studio.yaml, for llama-swap's sets: a
    voice assistant (chat, speech, retrieval) that may stay loaded together,
    images beside chat, and videos that need the GPU alone."""
    rng = random.Random(seed)
    everyone = tuple(STUDIO_MEMBERS)
    jobs = _streams(
        rng,
        [
            Stream("chat", "interactive", CHAT_MODEL, 60.0, (2.0, 8.0), everyone),
            Stream("speech", "interactive", TTS_MODEL, 60.0, (1.0, 3.0), everyone),
            Stream("retrieval", "normal", EMBED_MODEL, 60.0, (0.2, 1.0), everyone),
            Stream("image", "interactive", IMAGE_MODEL, 15.0, (5.0, 30.0), everyone),
            Stream("image", "normal", IMAGE_MODEL, 10.0, (10.0, 40.0), everyone),
            Stream("index", "batch", EMBED_MODEL, 30.0, (5.0, 20.0), everyone),
            Stream("video", "normal", VIDEO_MODEL, 2.0, (60.0, 240.0), everyone),
        ],
        0.0,
        4 * HOUR,
    )
    return Trace(
        name="studio-sets",
        description=(
            "4 hours of studio.yaml's five models on one GPU: interactive chat, speech and "
            "images, normal retrieval, images and videos, batch indexing on the embeddings "
            "model"
        ),
        seed=seed,
        jobs=tuple(jobs),
        members=dict(STUDIO_MEMBERS),
        swap_seconds=10.0,
        duration_seconds=4 * HOUR,
        model_priority={**STUDIO_MODEL_PRIORITY, TTS_MODEL: 2, EMBED_MODEL: 1},
    )


def chat_heavy(seed: int) -> Trace:
    """Mostly short chats, the workload a batching server (parallel slots) is
    for, with the jobs of other models that make it swap. The rates load one
    GPU running one job at a time at about 0.9 before any swap is counted."""
    rng = random.Random(seed)
    members = dict(STUDIO_MEMBERS)
    everyone = tuple(members)
    jobs = _streams(
        rng,
        [
            Stream("chat", "interactive", CHAT_MODEL, 240.0, (2.0, 6.0), everyone),
            Stream("chat", "normal", CHAT_MODEL, 240.0, (2.0, 6.0), everyone),
            Stream("image", "interactive", IMAGE_MODEL, 20.0, (20.0, 40.0), everyone),
            Stream("render", "batch", VIDEO_MODEL, 3.0, (180.0, 360.0), everyone),
        ],
        0.0,
        1 * HOUR,
    )
    return Trace(
        name="chat-heavy",
        description=(
            "1 hour of one GPU serving mostly short chats (2-6 s, interactive and normal) "
            "from nine members, with interactive images (20-40 s) and a few batch video "
            "renders (3-6 min) arriving among them"
        ),
        seed=seed,
        jobs=tuple(jobs),
        members=members,
        swap_seconds=10.0,
        duration_seconds=1 * HOUR,
        initial_model=CHAT_MODEL,
        model_priority=dict(STUDIO_MODEL_PRIORITY),
    )


# (member, priority header, model) in submission order.
LIVE_CHECK_JOBS = [
    ("ann", "batch", "chat-a"),
    ("ann", "batch", "chat-a"),
    ("bo", "batch", "chat-b"),
    ("cy", "normal", "chat-b"),
    ("ann", "normal", "chat-a"),
    ("ann", "normal", "chat-b"),
    ("bo", "interactive", "chat-a"),
    ("cy", "interactive", "chat-b"),
    ("ann", "interactive", "chat-a"),
    ("bo", "normal", "chat-a"),
    ("cy", "batch", "chat-a"),
    ("bo", "batch", "chat-b"),
    ("ann", "normal", "chat-a"),
    ("cy", "normal", "chat-a"),
]


def live_check(seed: int) -> Trace:
    """Small, all queued while dispatch is paused: the live-equivalence test's trace."""
    del seed  # hand-made: the same for every seed
    jobs = tuple(
        TraceJob(
            id=f"live-{n:02d}",
            member=member,
            priority=priority,
            model=model,
            seconds=0.05,
            kind="chat",
            at=round(n * 0.01, 2),
        )
        for n, (member, priority, model) in enumerate(LIVE_CHECK_JOBS, 1)
    )
    return Trace(
        name="live-check",
        description=(
            "14 chat jobs of three members (free, pro, max) in three bands on two models, "
            "queued while dispatch is paused and released at once"
        ),
        jobs=jobs,
        members={"ann": "free", "bo": "pro", "cy": "max"},
        swap_seconds=0.1,
        duration_seconds=1.0,
        dispatch_from=1.0,
        model_priority={"chat-a": 1, "chat-b": 0},
    )


GENERATORS: dict[str, Callable[[int], Trace]] = {
    "studio-day": studio_day,
    "studio-day-2gpu": studio_day_two_gpus,
    "flood": flood,
    "swap-heavy": swap_heavy,
    "live-check": live_check,
    "chat-heavy": chat_heavy,
    "studio-sets": studio_sets,
    # The studio day and the flood sent with request bodies, run times
    # following their sizes (traces/sizes.py): the estimates' goals.
    "studio-day-sized": lambda seed: with_sizes(
        studio_day(seed), seed=seed, name="studio-day-sized"
    ),  # noqa: E501
    "flood-sized": lambda seed: with_sizes(flood(seed), seed=seed, name="flood-sized"),
}


def write_all(*, seed: int, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, generate in GENERATORS.items():
        path = out / f"{name}.jsonl"
        dump_trace(generate(seed), path)
        written.append(path)
    return written
