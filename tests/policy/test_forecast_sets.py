"""The forecast with resident sets: a job of a co-resident model starts
beside the jobs in flight, a drain lasts only as long as the busy models
it unloads, and only the loads the routing predicts are charged (studio.yaml)."""

from __future__ import annotations

from queueapp.policy import PolicySettings
from queueapp.policy.forecast import play_forward
from queueapp.policy.forecast_timeline import ForecastGpu, InFlight
from tests.factories import NOW, STUDIO_ROUTING, candidate

ROUTING = STUDIO_ROUTING

SWAP = 3.0


def forward(gpu: ForecastGpu, *heads, run: dict[str, float]):
    played = play_forward(
        heads,
        now=NOW,
        gpu_free_at=gpu.free_at,
        resident_model=gpu.resident_model,
        settings=PolicySettings(),
        run_seconds=lambda job: run[job.model],
        swap_seconds=lambda model: SWAP,
        run_seconds_in_flight=lambda job, in_flight: run[job.model],
        gpus=[gpu],
    )
    return {entry.job_id: entry for entry in played}


def chat_running(routing=ROUTING, ready=frozenset({"chat-small"})) -> ForecastGpu:
    """A chat that ends 10 s from now, on the studio GPU."""
    return ForecastGpu(
        name="gpu0",
        free_at=NOW + 10,
        resident_model="chat-small",
        resident_models=ready,
        in_flight=(InFlight("chat-small", NOW + 10),),
        routing=routing,
    )


RUN = {"tts-kokoro": 2.0, "image-xl": 4.0, "chat-small": 10.0}


def test_tts_is_forecast_beside_the_chat_and_the_image_after_the_tts_it_unloads():
    played = forward(
        chat_running(),
        candidate(1, model="tts-kokoro", waited=2),
        candidate(2, model="image-xl", waited=1),
        run=RUN,
    )
    assert played[1].estimated_start == NOW  # beside the chat
    assert played[1].estimated_seconds == 2.0 + SWAP  # tts loads
    # The image waits for the tts it unloads (NOW + 5), not for the chat (NOW + 10).
    assert played[2].estimated_start == NOW + 5
    assert played[2].estimated_seconds == 4.0 + SWAP


def test_without_a_routing_each_waits_for_the_model_before():
    played = forward(
        chat_running(routing=None),
        candidate(1, model="tts-kokoro", waited=2),
        candidate(2, model="image-xl", waited=1),
        run=RUN,
    )
    assert played[1].estimated_start == NOW + 10
    assert played[2].estimated_start == NOW + 10 + 2.0 + SWAP


def test_a_model_kept_loaded_beside_another_is_not_charged_a_load():
    gpu = chat_running(ready=frozenset({"chat-small", "tts-kokoro"}))
    played = forward(gpu, candidate(1, model="tts"), run={"tts": 2.0})
    assert (played[1].estimated_start, played[1].estimated_seconds) == (NOW, 2.0)
