"""The cluster replay with llama-swap's resident sets (studio.yaml): jobs of
co-resident models side by side, a drain only for the busy model a load
unloads; without a routing, the replay as it was. And llama-swap alone on
several GPUs behind round-robin."""

from __future__ import annotations

from dataclasses import replace

import pytest

from queueapp.policy import PolicySettings
from queueapp.policy.occupancy import batched_seconds
from queueapp.simulation.baselines import make_policy
from queueapp.simulation.cluster import simulate_on_gpus
from queueapp.simulation.cluster_policies import ONE_MODEL, compare_on_gpus, gpusched_on
from queueapp.simulation.engine import Run, simulate
from queueapp.simulation.fleet import gpu_specs
from queueapp.simulation.llama_swap import (
    llama_swap_config,
    simulate_llama_swap,
    simulate_llama_swap_round_robin,
)
from queueapp.simulation.traces import TRACES_DIR, load_trace
from tests.factories import STUDIO_ROUTING, studio_config
from tests.simulation.helpers import job, trace

SWAP = 5.0
# A long chat runs; speech arrives (its model loads beside chat: the voice
# set), then an image (the picture set: its load unloads tts, busy then).
STUDIO = trace(
    job("chat", at=0.0, member="ann", priority="interactive", model="chat-small", seconds=20.0),
    job("speech", at=1.0, member="bo", priority="interactive", model="tts-kokoro", seconds=2.0),
    job("image", at=2.0, member="cy", priority="interactive", model="image-xl", seconds=5.0),
    swap_seconds=SWAP,
    initial_model="chat-small",
)


def _replay(routing=STUDIO_ROUTING, workload=STUDIO) -> Run:
    policy = gpusched_on(workload, PolicySettings())
    return simulate_on_gpus(workload, policy, gpu_specs(1), routing=routing)


def _by_id(run: Run) -> dict:
    return {dispatch.job.job.id: dispatch for dispatch in run.dispatches}


def _fingerprint(run: Run) -> list[tuple]:
    return [
        (d.job.job.id, d.gpu, d.started_at, d.finished_at, d.swapped, d.changed_by, d.in_flight)
        for d in run.dispatches
    ]


def test_speech_starts_beside_chat_and_the_image_waits_only_for_it():
    runs = _by_id(_replay())
    chat, speech, image = runs["chat"], runs["speech"], runs["image"]
    assert chat.started_at == 0.0 and not chat.swapped  # chat was loaded
    # tts loads beside the running chat: no wait for chat's end.
    assert speech.started_at == 1.0 and speech.swapped
    assert speech.started_at < chat.finished_at
    assert speech.finished_at == pytest.approx(1.0 + SWAP + batched_seconds(2.0, 2))
    # The image's load unloads tts: it waits for the speech, not for the chat.
    assert image.started_at == speech.finished_at
    assert image.started_at < chat.finished_at
    assert image.swapped and image.in_flight == 2


def test_the_drain_for_the_image_is_recorded_once():
    run = _replay()
    assert [(drain.chosen.job.id, drain.at) for drain in run.drains] == [("image", 2.0)]


def test_without_a_routing_one_model_runs_at_a_time():
    runs = _by_id(_replay(routing=None))
    assert runs["speech"].started_at >= runs["chat"].finished_at
    assert all(dispatch.in_flight == 1 for dispatch in runs.values())


def test_the_replay_without_a_routing_is_the_one_gpu_engines():
    committed = load_trace(TRACES_DIR / "studio-sets.jsonl")
    for workload in (STUDIO, committed):
        expected = simulate(workload, make_policy("gpusched", workload))
        got = _replay(routing=None, workload=workload)
        assert [(d.job.job_id, d.started_at, d.finished_at, d.swapped) for d in got.dispatches] == [
            (d.job.job_id, d.started_at, d.finished_at, d.swapped) for d in expected.dispatches
        ]


def test_a_routing_changes_only_the_policies_that_read_sets():
    committed = load_trace(TRACES_DIR / "studio-sets.jsonl")
    names = ["gpusched", ONE_MODEL, "round-robin+collate"]
    with_sets = compare_on_gpus(committed, 2, names, routing=STUDIO_ROUTING)
    without = compare_on_gpus(committed, 2, ["gpusched", "gpusched", "round-robin+collate"])
    assert [run.policy for run in with_sets] == ["gpusched+sets", ONE_MODEL, names[2]]
    # The one-model row is gpusched with the routing ignored.
    assert _fingerprint(with_sets[1]) == _fingerprint(without[1])
    assert _fingerprint(with_sets[2]) == _fingerprint(without[2])
    assert _fingerprint(with_sets[0]) != _fingerprint(without[0])


def test_llama_swap_round_robin_on_one_gpu_is_llama_swap_alone():
    config = llama_swap_config(studio_config())
    committed = load_trace(TRACES_DIR / "studio-sets.jsonl")
    alone = simulate_llama_swap(committed, config)
    balanced = simulate_llama_swap_round_robin(committed, config, 1)
    assert [replace(d, gpu="") for d in balanced.dispatches] == alone.dispatches


def test_llama_swap_round_robin_sends_request_n_to_gpu_n_mod_2():
    config = llama_swap_config(studio_config())
    run = simulate_llama_swap_round_robin(STUDIO, config, 2)
    gpus = {d.job.job.id: d.gpu for d in run.dispatches}
    assert gpus == {"chat": "gpu0", "speech": "gpu1", "image": "gpu0"}
    assert run.gpus == ("gpu0", "gpu1")
