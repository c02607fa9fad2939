"""Sized traces: each job sent with a request body, its run time following the body's size.

A sized trace is a committed trace with the same arrivals, members, bands
and models, where each job carries the request it is sent with (path and
body, `request_size` reading its size as a submission does) and runs for
its size's true time times noise:

    seconds = SECONDS_PER_UNIT[model] × size × e^(σ·z),  σ = NOISE_SIGMA, z ~ N(0, 1)

The size is drawn so that its true time is near the job's seconds in the
unsized trace (so the mix of short and long jobs is the one the trace was
made with), and z comes from its own generator seeded from the trace's
seed: the same seed writes the same noise, which no goal can be tuned by.
fixtures/traces/README.md documents the rules.
"""

from __future__ import annotations

import math
import random
from dataclasses import replace
from typing import Any

from queueapp.simulation.traces import Trace, TraceJob, with_request

IMAGE_PATH = "/v1/images/generations"
CHAT_PATH = "/v1/chat/completions"
SPEECH_PATH = "/v1/audio/speech"
NOISE_SIGMA = 0.2
# Seconds per unit of size (request_size's units), per model: an image
# per (image × megapixel × step), a video per (frame × step × megapixel),
# a chat per token (output plus prompt / PREFILL_RATIO), speech per character.
SECONDS_PER_UNIT = {
    "image-xl": 0.5,  # 1024×1024 at 20 steps: 10.5 s
    "video-wan": 0.25,  # 81 frames, 30 steps, 832×480: 243 s
    "chat-small": 0.02,  # 50 tokens a second
    "tts-kokoro": 0.01,
}
IMAGE_RESOLUTIONS = ((1024, 1024), (768, 768), (1152, 896), (896, 1152))
VIDEO_RESOLUTIONS = ((832, 480), (1280, 720))
VIDEO_STEPS = (30, 40, 50)
# A film's shots are one setting: Wan's 81 frames at 30 steps, 832×480.
FILM_SHOT = {"num_frames": 81, "num_inference_steps": 30, "width": 832, "height": 480}
PROMPT_CHARS = (100, 4000)


def with_sizes(trace: Trace, *, seed: int, name: str) -> Trace:
    """`trace` with each job's request and run time drawn by the module's rule."""
    sizes = random.Random(f"{seed}:{name}:sizes")
    noise = random.Random(f"{seed}:{name}:noise")
    jobs = []
    for job in trace.jobs:
        sized = _request(job, sizes)
        assert sized.size is not None  # every rule's body names its size
        true_seconds = SECONDS_PER_UNIT[job.model] * sized.size
        seconds = round(true_seconds * math.exp(noise.gauss(0.0, NOISE_SIGMA)), 1)
        jobs.append(replace(sized, seconds=max(0.1, seconds)))
    return replace(
        trace,
        name=name,
        jobs=tuple(jobs),
        description=(
            f"{trace.description}; each job sent with a request body whose size sets its "
            f"run time (a per-model rate times log-normal noise, sigma {NOISE_SIGMA})"
        ),
    )


def _request(job: TraceJob, rng: random.Random) -> TraceJob:
    """`job` with a body whose true time is near its unsized seconds."""
    rate = SECONDS_PER_UNIT[job.model]
    units = job.seconds / rate
    if job.model == "video-wan":
        return with_request(job, path=IMAGE_PATH, body=_video_body(job, units, rng))
    if job.model == "image-xl":
        return with_request(job, path=IMAGE_PATH, body=_image_body(units, rng))
    if job.model == "chat-small":
        prompt_chars = rng.randint(*PROMPT_CHARS)
        prompt_units = prompt_chars / 4 / 20  # request_size's characters per token, prefill ratio
        max_tokens = max(16, round(units - prompt_units))
        return with_request(
            job, path=CHAT_PATH, body={"max_tokens": max_tokens}, prompt_chars=prompt_chars
        )
    if job.model == "tts-kokoro":
        return with_request(job, path=SPEECH_PATH, body={"input": "x" * max(1, round(units))})
    raise ValueError(f"no size rule for model {job.model!r}")


def _image_body(units: float, rng: random.Random) -> dict[str, Any]:
    count = 2 if rng.random() < 0.2 else 1
    width, height = rng.choice(IMAGE_RESOLUTIONS)
    steps = round(units / (count * width * height / 1e6))
    return {"n": count, "size": f"{width}x{height}", "steps": min(max(steps, 4), 100)}


def _video_body(job: TraceJob, units: float, rng: random.Random) -> dict[str, Any]:
    if job.kind == "film-shot":
        return dict(FILM_SHOT)
    width, height = rng.choice(VIDEO_RESOLUTIONS)
    steps = rng.choice(VIDEO_STEPS)
    frames = units / (steps * width * height / 1e6)
    # Wan renders 4k + 1 frames.
    wan_frames = min(max(4 * round((frames - 1) / 4) + 1, 17), 481)
    return {
        "num_frames": wan_frames,
        "num_inference_steps": steps,
        "width": width,
        "height": height,
    }
