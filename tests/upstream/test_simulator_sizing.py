"""The simulator's run time follows a request's size for the models that opt in
(queueapp/upstream/simulator/sizing.py), over real HTTP with tiny durations."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from queueapp.upstream.simulator import LlamaSwapSimulator
from queueapp.upstream.simulator.cli import build_parser, simulator_from_args
from queueapp.upstream.simulator.config import parse_config
from queueapp.upstream.simulator.sizing import sized_seconds

TIMING_TOLERANCE_S = 0.02  # the simulator's sleep wakes up to this late or early


def video(frames: int, **extra: Any) -> dict[str, Any]:
    return {"model": "video", "prompt": "a fox", "num_frames": frames, **extra}


def run_of(client: httpx.Client, path: str, body: dict[str, Any]) -> dict[str, Any]:
    response = client.post(path, json=body)
    assert response.status_code == 200, response.text
    entry: dict[str, Any] = client.get("/sim/log").json()[-1]
    return entry


@pytest.fixture
def sized(make_sim: Callable[..., LlamaSwapSimulator]) -> Iterator[httpx.Client]:
    sim = make_sim(models={"video": 0.05, "chat": 0.05}, size_scaled=True, initial_model="video")
    with httpx.Client(base_url=sim.url, timeout=10) as client:
        yield client


def test_a_360_frame_video_runs_six_times_a_60_frame_one(sized: httpx.Client) -> None:
    short = run_of(sized, "/v1/images/generations", video(60))
    long = run_of(sized, "/v1/images/generations", video(360))
    assert short["run_seconds"] == pytest.approx(0.05)
    assert long["run_seconds"] == pytest.approx(6 * short["run_seconds"])
    held_long = long["finished_at"] - long["started_at"]
    held_short = short["finished_at"] - short["started_at"]
    assert held_long >= 0.3 - TIMING_TOLERANCE_S
    assert held_long / held_short == pytest.approx(6, rel=0.5)


def test_a_body_without_size_fields_runs_the_models_seconds(sized: httpx.Client) -> None:
    entry = run_of(sized, "/v1/images/generations", {"model": "video", "prompt": "a fox"})
    assert entry["run_seconds"] == pytest.approx(0.05)
    chat = {"model": "chat", "messages": [{"role": "user", "content": "hello"}]}
    assert run_of(sized, "/v1/chat/completions", chat)["run_seconds"] == pytest.approx(0.05)


def test_sim_seconds_wins_over_the_size(sized: httpx.Client) -> None:
    entry = run_of(sized, "/v1/images/generations", video(360, sim={"seconds": 0.01}))
    assert entry["run_seconds"] == pytest.approx(0.01)


def test_without_the_option_the_size_changes_nothing(
    make_sim: Callable[..., LlamaSwapSimulator],
) -> None:
    sim = make_sim(models={"video": 0.05}, initial_model="video")
    with httpx.Client(base_url=sim.url, timeout=10) as client:
        entry = run_of(client, "/v1/images/generations", video(360, steps=40))
    assert entry["run_seconds"] == pytest.approx(0.05)


def test_a_configs_model_opts_in_by_its_metadata() -> None:
    config = parse_config(
        {
            "models": {
                "video": {"metadata": {"simulator": {"seconds": 0.05, "size_scaled": True}}},
                "chat": {"metadata": {"simulator": {"seconds": 0.05}}},
            }
        }
    )
    sim = LlamaSwapSimulator(config=config)
    assert sim.gpu.scales_with_size("video") and not sim.gpu.scales_with_size("chat")


def test_the_command_line_flag_scales_every_model() -> None:
    args = build_parser().parse_args(["--model", "video=1", "--size-scaled", "--port", "0"])
    assert simulator_from_args(args).gpu.scales_with_size("video")


RULE = [
    # kind, body, body bytes, scale
    ("image", {"num_frames": 120, "steps": 40, "width": 1664, "height": 480}, 0, 2 * 2 * 2),
    ("sdapi", {"video_frames": 30, "size": "832*480"}, 0, 0.5),
    ("image", {"n": 4, "size": "512x512", "steps": 10}, 0, 4 * 0.25 * 0.5),
    ("sdapi", {"batch_size": 2, "n_iter": 3, "width": 1024, "height": 1024}, 0, 6),
    ("chat", {"max_tokens": 512}, 0, 2),
    ("chat", {"max_completion_tokens": 64, "max_tokens": 512}, 0, 0.25),
    ("completion", {"max_tokens": 128}, 0, 0.5),
    ("speech", {"input": "x" * 600}, 0, 3),
    ("transcription", None, 2_500_000, 2.5),
    ("embeddings", {"input": ["x" * 1000, "y" * 3000]}, 0, 2),
    ("image", {"n": "4", "steps": -1, "size": "big", "width": float("nan")}, 0, 1),
    ("chat", {"max_tokens": 10**9}, 0, 10_000),
]


@pytest.mark.parametrize(("kind", "body", "body_bytes", "scale"), RULE)
def test_the_rule_scales_each_factor_by_its_reference(
    kind: str, body: Any, body_bytes: int, scale: float
) -> None:
    assert sized_seconds(kind, 2.0, body, body_bytes=body_bytes) == pytest.approx(2.0 * scale)
