"""The simulator serving a llama-swap config (``--config``), over real HTTP: several models
resident as the routing allows, a busy model never stopped, ``concurrencyLimit``, aliases,
and a bad config refused at startup."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from queueapp.upstream.simulator import LlamaSwapSimulator
from queueapp.upstream.simulator.cli import main
from queueapp.upstream.simulator.config import SwapConfig, load_config, parse_config
from queueapp.upstream.simulator.routes import MSG_LOAD_UNLOADED
from tests.upstream.helpers import chat, in_background, wait_until

STUDIO = Path(__file__).resolve().parents[2] / "fixtures" / "llama-swap" / "studio.yaml"
FAST = {"chat-small": 0.05, "tts-kokoro": 0.05, "embed-small": 0.05, "image-xl": 0.05}
FAST["video-wan"] = 0.05

MakeSim = Callable[..., LlamaSwapSimulator]


def running(sim: LlamaSwapSimulator) -> dict[str, str]:
    return {
        entry["model"]: entry["state"]
        for entry in httpx.get(f"{sim.url}/running").json()["running"]
    }


def ask(sim: LlamaSwapSimulator, model: str, **sim_options: Any) -> httpx.Response:
    body = chat(model, sim=sim_options) if sim_options else chat(model)
    return httpx.post(f"{sim.url}/v1/chat/completions", json=body, timeout=10)


def entry_for(sim: LlamaSwapSimulator, model: str) -> dict[str, Any] | None:
    entries = [e for e in sim.log() if e["model"] == model]
    return entries[-1] if entries else None


@pytest.fixture
def studio(make_sim: MakeSim) -> LlamaSwapSimulator:
    return make_sim(config=load_config(STUDIO), models=FAST, swap_seconds=0.05)


def group_sim(make_sim: MakeSim, groups: str) -> LlamaSwapSimulator:
    text = "models: {a: {}, b: {}, c: {}}\n" + groups
    config: SwapConfig = parse_config(yaml.safe_load(text))
    return make_sim(config=config, models={"a": 0.01, "b": 0.01, "c": 0.01}, swap_seconds=0.01)


# -- co-residency on studio.yaml ----------------------------------------------------------


def test_chat_and_tts_are_both_ready_side_by_side(studio: LlamaSwapSimulator) -> None:
    assert ask(studio, "chat-small").status_code == 200
    speech = httpx.post(
        f"{studio.url}/v1/audio/speech", json={"model": "tts-kokoro", "input": "hi"}
    )
    assert speech.status_code == 200
    assert running(studio) == {"chat-small": "ready", "tts-kokoro": "ready"}
    assert ask(studio, "embed-small").status_code == 200
    assert running(studio) == {"chat-small": "ready", "embed-small": "ready", "tts-kokoro": "ready"}


def test_an_image_stops_tts_and_keeps_chat(studio: LlamaSwapSimulator) -> None:
    for model in ("chat-small", "tts-kokoro"):
        assert ask(studio, model).status_code == 200
    image = httpx.post(
        f"{studio.url}/v1/images/generations", json={"model": "image-xl", "prompt": "a cat"}
    )
    assert image.status_code == 200
    assert running(studio) == {"chat-small": "ready", "image-xl": "ready"}


def test_a_video_runs_alone(studio: LlamaSwapSimulator) -> None:
    for model in ("chat-small", "tts-kokoro", "embed-small"):
        assert ask(studio, model).status_code == 200
    assert ask(studio, "video-wan").status_code == 200
    assert running(studio) == {"video-wan": "ready"}


def test_each_load_pays_the_swap_and_a_resident_model_does_not(
    studio: LlamaSwapSimulator,
) -> None:
    for model in ("chat-small", "tts-kokoro", "chat-small"):
        assert ask(studio, model).status_code == 200
    loads = [(e["model"], e["swapped"], e["load_seconds"]) for e in studio.log()]
    assert loads == [
        ("chat-small", True, 0.05),
        ("tts-kokoro", True, 0.05),
        ("chat-small", False, 0.0),
    ]


def test_model_status_events_show_every_resident_model(
    studio: LlamaSwapSimulator, open_events: Callable[[LlamaSwapSimulator], Any]
) -> None:
    stream = open_events(studio)
    for model in ("chat-small", "tts-kokoro"):
        assert ask(studio, model).status_code == 200

    def both_ready(event: dict[str, Any]) -> bool:
        if event["type"] != "modelStatus":
            return False
        states = {m["id"]: m["state"] for m in event["data"]}
        return states["chat-small"] == states["tts-kokoro"] == "ready"

    last = stream.until(both_ready)[-1]
    states = {m["id"]: m["state"] for m in last["data"]}
    assert states == {
        "chat-small": "ready",
        "tts-kokoro": "ready",
        "embed-small": "stopped",
        "image-xl": "stopped",
        "video-wan": "stopped",
    }


# -- a busy model is never stopped ------------------------------------------------------------


def test_a_request_that_would_stop_a_busy_model_waits_until_it_is_free(
    studio: LlamaSwapSimulator,
) -> None:
    long_chat = in_background(lambda: ask(studio, "chat-small", seconds=1.5))
    # Admitted is not yet loaded: chat is "starting" for its swap, then "ready".
    wait_until(lambda: running(studio) == {"chat-small": "ready"}, "chat loaded")
    video = in_background(lambda: ask(studio, "video-wan"))
    wait_until(lambda: entry_for(studio, "video-wan") is not None, "video received")
    # While chat computes, the video waits and chat stays resident.
    assert (entry_for(studio, "video-wan") or {}).get("started_at", 0) is None
    assert running(studio) == {"chat-small": "ready"}
    chat_answer, video_answer = long_chat(), video()
    assert (chat_answer.status_code, video_answer.status_code) == (200, 200)  # chat not cut
    chat_entry, video_entry = entry_for(studio, "chat-small"), entry_for(studio, "video-wan")
    assert chat_entry and video_entry
    assert video_entry["started_at"] >= chat_entry["finished_at"]
    assert running(studio) == {"video-wan": "ready"}


def test_a_request_for_a_model_beside_the_busy_one_does_not_wait(
    studio: LlamaSwapSimulator,
) -> None:
    long_chat = in_background(lambda: ask(studio, "chat-small", seconds=2.0))
    wait_until(lambda: running(studio) == {"chat-small": "ready"}, "chat loaded")
    assert ask(studio, "tts-kokoro").status_code == 200
    chat_entry = entry_for(studio, "chat-small")
    assert chat_entry and chat_entry["finished_at"] is None  # tts ran while chat computed
    assert running(studio) == {"chat-small": "ready", "tts-kokoro": "ready"}
    assert long_chat().status_code == 200


# -- concurrencyLimit and aliases ---------------------------------------------------------


def test_over_its_concurrency_limit_a_model_answers_429(studio: LlamaSwapSimulator) -> None:
    url = f"{studio.url}/v1/images/generations"
    body = {"model": "image-xl", "prompt": "a cat", "sim": {"seconds": 1.0}}
    first = in_background(lambda: httpx.post(url, json=body, timeout=10))
    wait_until(lambda: entry_for(studio, "image-xl") is not None, "first image received")
    refused = httpx.post(url, json=body, timeout=10)
    assert refused.status_code == 429
    assert refused.headers["Retry-After"] == "1"
    assert refused.json()["error"]["type"] == "rate_limit_error"
    assert first().status_code == 200
    assert httpx.post(url, json={"model": "image-xl", "prompt": "a cat"}).status_code == 200


def test_waiting_requests_count_against_the_concurrency_limit(make_sim: MakeSim) -> None:
    text = "models: {a: {concurrencyLimit: 2}, b: {}}\n"
    # "a" runs 2 s: the first is still running when the third asks, however
    # busy the machine (with 0.5 s, a loaded one had ended it by then).
    sim = make_sim(config=parse_config(yaml.safe_load(text)), models={"a": 2.0, "b": 0.01})
    # parallel 1: the second request for "a" waits in the queue, still admitted.
    first = in_background(lambda: ask(sim, "a"))
    wait_until(lambda: (entry_for(sim, "a") or {}).get("started_at") is not None, "a admitted")
    second = in_background(lambda: ask(sim, "a"))
    wait_until(lambda: len([e for e in sim.log() if e["model"] == "a"]) == 2, "second received")
    assert ask(sim, "a").status_code == 429
    assert (first().status_code, second().status_code) == (200, 200)


def test_an_alias_is_served_by_its_model(studio: LlamaSwapSimulator) -> None:
    assert ask(studio, "assistant").status_code == 200
    assert ask(studio, "tts").status_code == 200
    assert running(studio) == {"chat-small": "ready", "tts-kokoro": "ready"}
    assert ask(studio, "nobody").status_code == 404


def test_an_unload_of_one_model_leaves_the_others(studio: LlamaSwapSimulator) -> None:
    for model in ("chat-small", "tts-kokoro"):
        assert ask(studio, model).status_code == 200
    assert httpx.post(f"{studio.url}/api/models/unload/tts").status_code == 200
    assert running(studio) == {"chat-small": "ready"}
    assert httpx.post(f"{studio.url}/api/models/unload").status_code == 200
    assert running(studio) == {}


# -- the group engine over HTTP ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("groups", "order", "resident"),
    [
        ("groups: {g: {members: [a, b]}}\n", "ab", {"b"}),  # swap
        ("groups: {g: {swap: false, exclusive: false, members: [a, b]}}\n", "ab", {"a", "b"}),
        ("groups: {g1: {members: [a]}, g2: {members: [b]}}\n", "ab", {"b"}),  # exclusive
        (  # persistent
            "groups: {p: {exclusive: false, persistent: true, members: [a]}, o: {members: [b]}}\n",
            "ab",
            {"a", "b"},
        ),
        # the quirk: a non-exclusive group's model leaves the exclusive group running ...
        ("groups: {g1: {members: [a]}, g2: {exclusive: false, members: [b]}}\n", "ab", {"a", "b"}),
        # ... and the exclusive group's running model, asked again, stops the other.
        ("groups: {g1: {members: [a]}, g2: {exclusive: false, members: [b]}}\n", "aba", {"a"}),
        # c is in the default group: exclusive, so it stops the others.
        (
            "routing: {router: {settings: {groups: {g: {swap: false, members: [a, b]}}}}}\n",
            "abc",
            {"c"},
        ),
    ],
)
def test_the_group_engine_keeps_what_llama_swap_keeps(
    make_sim: MakeSim, groups: str, order: str, resident: set[str]
) -> None:
    sim = group_sim(make_sim, groups)
    for model in order:
        assert ask(sim, model).status_code == 200
    assert set(running(sim)) == resident


def test_a_matrix_keeps_the_cheapest_set(make_sim: MakeSim) -> None:
    text = (
        "models: {a: {}, b: {}, c: {}}\n"
        "matrix: {evict_costs: {b: 3}, sets: {with_c: a & c, with_b: a & +only_b, only_b: b}}\n"
    )
    sim = make_sim(
        config=parse_config(yaml.safe_load(text)), models={"a": 0.01, "b": 0.01, "c": 0.01}
    )
    for model in ("b", "c"):
        assert ask(sim, model).status_code == 200
    assert set(running(sim)) == {"c"}  # b and c share no set
    assert ask(sim, "b").status_code == 200
    assert ask(sim, "a").status_code == 200
    assert set(running(sim)) == {"a", "b"}


# -- a bad config -------------------------------------------------------------------------------


def test_a_bad_config_stops_the_start_with_the_key_at_fault(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("models: {a: {}}\nrouting: {router: {use: mesh}}\n")
    assert main(["--config", str(path), "--port", "0"]) == 1
    assert "routing.router.use: unknown router 'mesh'" in capsys.readouterr().err


def test_a_config_that_cannot_be_read_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--config", str(tmp_path / "missing.yaml"), "--port", "0"]) == 1
    assert "--config: cannot read" in capsys.readouterr().err
    (tmp_path / "broken.yaml").write_text("models: [a\n")
    assert main(["--config", str(tmp_path / "broken.yaml"), "--port", "0"]) == 1
    assert "is not valid YAML" in capsys.readouterr().err


def test_a_model_past_its_ttl_unloads_and_leaves_its_neighbour(make_sim: MakeSim) -> None:
    text = "models: {a: {ttl: 1}, b: {}}\nmatrix: {sets: {pair: a & b}}\n"
    sim = make_sim(config=parse_config(yaml.safe_load(text)), models={"a": 0.01, "b": 0.01})
    for model in ("a", "b"):
        assert ask(sim, model).status_code == 200
    assert running(sim) == {"a": "ready", "b": "ready"}
    wait_until(lambda: running(sim) == {"b": "ready"}, "a unloaded by its ttl")


def test_an_unload_of_a_busy_model_answers_its_queue_and_frees_the_waiting_video(
    make_sim: MakeSim,
) -> None:
    # One chat slot, whatever the config's -np says: the second chat queues.
    studio = make_sim(
        config=load_config(STUDIO),
        models=FAST,
        swap_seconds=0.05,
        parallel_models={"chat-small": 1},
    )
    long_chat = in_background(lambda: ask(studio, "chat-small", seconds=2.0))
    wait_until(
        lambda: (entry_for(studio, "chat-small") or {}).get("started_at") is not None,
        "chat admitted",
    )
    queued_chat = in_background(lambda: ask(studio, "chat-small"))  # parallel 1: it waits
    video = in_background(lambda: ask(studio, "video-wan"))
    wait_until(lambda: entry_for(studio, "video-wan") is not None, "video received")
    wait_until(lambda: len([e for e in studio.log() if e["model"] == "chat-small"]) == 2, "queued")
    assert httpx.post(f"{studio.url}/api/models/unload/chat-small").status_code == 200
    assert long_chat().status_code == 502  # killed mid-answer, as llama-swap's Unload does
    queued = queued_chat()  # OnUnload answers a request queued for the model with an error
    assert (queued.status_code, queued.json()["error"]["message"]) == (500, MSG_LOAD_UNLOADED)
    assert video().status_code == 200  # the GPU is free: the waiting video starts
    assert running(studio) == {"video-wan": "ready"}
