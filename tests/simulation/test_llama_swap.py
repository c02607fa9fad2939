"""The `llama-swap-sets` baseline: llama-swap v250's FIFO scheduler with the
sets of fixtures/llama-swap/studio.yaml (chat beside TTS and embeddings,
image beside chat, video alone), on small hand-made traces."""

from __future__ import annotations

from io import StringIO
from pathlib import Path

import pytest
import yaml
from django.core.management import CommandError, call_command

from queueapp.policy.routing import RoutingConfigError
from queueapp.simulation.baselines import compare
from queueapp.simulation.engine import Dispatch, Run
from queueapp.simulation.llama_swap import (
    NAME,
    ROUND_ROBIN_NAME,
    LlamaSwapConfig,
    llama_swap_config,
    simulate_llama_swap,
)
from queueapp.simulation.metrics import summarize
from queueapp.simulation.traces import TRACES_DIR, load_trace
from tests.simulation.helpers import job, trace

STUDIO = Path(__file__).resolve().parents[2] / "fixtures" / "llama-swap" / "studio.yaml"
CHAT, TTS, IMAGE, VIDEO = "chat-small", "tts-kokoro", "image-xl", "video-wan"
SWAP = 5.0  # helpers.trace's swap_seconds


def studio(priority: dict[str, int] | None = None) -> LlamaSwapConfig:
    raw = yaml.safe_load(STUDIO.read_text())
    if priority is not None:
        raw["routing"]["scheduler"] = {"settings": {"fifo": {"priority": priority}}}
    return llama_swap_config(raw)


def replay(*jobs, config: LlamaSwapConfig | None = None, **options) -> dict[str, Dispatch]:
    run = simulate_llama_swap(trace(*jobs, **options), config or studio())
    assert len(run.dispatches) == len(jobs)
    return {dispatch.job.job.id: dispatch for dispatch in run.dispatches}


def test_tts_beside_a_busy_chat_loads_without_unloading_it_then_runs_at_once():
    runs = replay(
        job("chat", model=CHAT, seconds=100.0),
        job("tts-1", at=1.0, model=TTS, seconds=2.0),
        job("tts-2", at=20.0, model=TTS, seconds=2.0),
        job("chat-2", at=30.0, model=CHAT, seconds=2.0),
    )
    # The first TTS request loads TTS beside the busy chat instead of waiting for it.
    assert (runs["tts-1"].started_at, runs["tts-1"].swapped) == (1.0, True)
    # Both stay loaded: the next TTS and chat requests start at once, with no load.
    assert (runs["tts-2"].started_at, runs["tts-2"].swapped) == (20.0, False)
    assert (runs["chat-2"].started_at, runs["chat-2"].swapped) == (30.0, False)


def test_image_unloads_tts_not_chat_and_waits_while_tts_is_busy():
    runs = replay(
        job("chat", model=CHAT, seconds=100.0),
        job("tts", model=TTS, seconds=20.0),
        job("image", at=10.0, model=IMAGE, seconds=5.0),
        job("chat-2", at=60.0, model=CHAT, seconds=1.0),
        job("tts-2", at=60.0, model=TTS, seconds=1.0),
    )
    tts_ends = runs["tts"].finished_at
    assert tts_ends > 10.0
    assert (runs["image"].started_at, runs["image"].swapped) == (tts_ends, True)
    # Chat stayed loaded beside the image; TTS was unloaded and loads again.
    assert (runs["chat-2"].started_at, runs["chat-2"].swapped) == (60.0, False)
    assert runs["tts-2"].swapped


def test_video_waits_for_every_busy_model_and_unloads_them_all():
    runs = replay(
        job("chat", model=CHAT, seconds=50.0),
        job("tts", model=TTS, seconds=20.0),
        job("video", at=1.0, model=VIDEO, seconds=10.0),
        job("chat-2", at=200.0, model=CHAT, seconds=1.0),
    )
    last_end = max(runs["chat"].finished_at, runs["tts"].finished_at)
    assert runs["chat"].finished_at == last_end  # it outlasts tts: the wait is for both
    assert (runs["video"].started_at, runs["video"].swapped) == (last_end, True)
    assert runs["chat-2"].swapped  # chat was unloaded for the video


def test_blocked_requests_go_in_arrival_order():
    # Both wait for the busy video; the image came first, and TTS cannot run
    # beside it, so TTS waits for the image's request too.
    jobs = (
        job("video", model=VIDEO, seconds=30.0),
        job("image", at=1.0, model=IMAGE, seconds=10.0),
        job("tts", at=2.0, model=TTS, seconds=10.0),
    )
    runs = replay(*jobs)
    assert runs["image"].started_at == runs["video"].finished_at
    assert runs["tts"].started_at == runs["image"].finished_at
    # The config's fifo priority puts TTS first.
    runs = replay(*jobs, config=studio({TTS: 1}))
    assert runs["tts"].started_at == runs["video"].finished_at
    assert runs["image"].started_at == runs["tts"].finished_at


def test_a_request_that_needs_no_unload_starts_past_a_blocked_one():
    # fifo.go looks at the queue only when something ends: an image, which
    # may run beside chat, loads at once while the video waits for chat.
    runs = replay(
        job("chat", model=CHAT, seconds=30.0),
        job("video", at=1.0, model=VIDEO, seconds=10.0),
        job("image", at=2.0, model=IMAGE, seconds=10.0),
    )
    assert (runs["image"].started_at, runs["image"].swapped) == (2.0, True)
    assert runs["video"].started_at == max(runs["chat"].finished_at, runs["image"].finished_at)


def test_fast_path_serves_a_ready_model_ahead_of_the_queue():
    runs = replay(
        job("chat", model=CHAT, seconds=30.0),
        job("video", at=1.0, model=VIDEO, seconds=10.0),
        job("chat-2", at=10.0, model=CHAT, seconds=5.0),
    )
    # chat is ready with nothing to unload: served at once, past the queued video.
    assert (runs["chat-2"].started_at, runs["chat-2"].swapped) == (10.0, False)
    chat_done = max(runs["chat"].finished_at, runs["chat-2"].finished_at)
    assert runs["video"].started_at == chat_done


def test_requests_for_a_loading_model_join_its_load():
    runs = replay(
        job("tts-1", model=TTS, seconds=1.0),
        job("tts-2", at=2.0, model=TTS, seconds=1.0),
    )
    assert (runs["tts-1"].started_at, runs["tts-1"].swapped) == (0.0, True)
    assert (runs["tts-2"].started_at, runs["tts-2"].swapped) == (SWAP, False)


def test_a_model_serves_its_concurrency_limit_at_once():
    # image-xl has concurrencyLimit 1: the second image waits for the first.
    runs = replay(
        job("image-1", model=IMAGE, seconds=10.0),
        job("image-2", model=IMAGE, seconds=10.0),
    )
    assert runs["image-2"].started_at == runs["image-1"].finished_at
    assert runs["image-2"].in_flight == 1


def test_without_a_config_it_is_fifo_collate_to_the_figure():
    day = load_trace(TRACES_DIR / "studio-day.jsonl")
    (collate,) = compare(day, ["fifo-collate"])
    alone = simulate_llama_swap(day, None)
    assert alone.policy == NAME
    assert alone.dispatches == collate.dispatches


def test_priority_of_an_unknown_model_is_refused_naming_the_key():
    with pytest.raises(RoutingConfigError, match=r"routing\.scheduler\.settings\.fifo\.priority"):
        studio({"nope": 1})


def test_the_studio_trace_runs_every_job_once():
    sets = load_trace(TRACES_DIR / "studio-sets.jsonl")
    run: Run = simulate_llama_swap(sets, studio())
    assert sorted(run.order) == sorted(job.id for job in sets.jobs)
    assert summarize(run).swaps < summarize(compare(sets, ["fifo-collate"])[0]).swaps


def simulate(*args: str) -> str:
    out = StringIO()
    call_command("simulate", *args, stdout=out)
    return out.getvalue()


def test_command_adds_the_row_before_gpusched():
    output = simulate(str(TRACES_DIR / "studio-sets.jsonl"), "--llama-swap-config", str(STUDIO))
    rows = [line.split("|")[1].strip() for line in output.splitlines() if line.startswith("| ")]
    assert rows[rows.index(NAME) + 1] == "gpusched"
    assert NAME not in simulate(str(TRACES_DIR / "studio-sets.jsonl"), "--policy", "fifo")


def test_command_refuses_a_bad_config_naming_the_key(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("models:\n  m: {cmd: x}\nrouting:\n  router: {use: mesh}\n")
    with pytest.raises(CommandError, match=r"routing\.router\.use"):
        simulate(str(TRACES_DIR / "live-check.jsonl"), "--llama-swap-config", str(bad))


def test_command_refuses_a_trace_whose_models_the_config_lacks():
    with pytest.raises(CommandError, match="chat-a"):
        simulate(str(TRACES_DIR / "live-check.jsonl"), "--llama-swap-config", str(STUDIO))


def test_command_on_two_gpus_reads_the_sets_and_adds_llama_swap_behind_round_robin():
    output = simulate(
        str(TRACES_DIR / "studio-sets.jsonl"),
        "--gpus",
        "2",
        "--policy",
        "gpusched",
        "--policy",
        "round-robin+collate",
        "--llama-swap-config",
        str(STUDIO),
    )
    rows = {line.split("|")[1].strip() for line in output.splitlines() if line.startswith("| ")}
    assert {"gpusched+sets", "round-robin+collate", ROUND_ROBIN_NAME} <= rows
