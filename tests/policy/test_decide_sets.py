"""`decide` with resident sets: jobs of co-resident models side by side,
drains only for the busy models a load would unload, each model bounded
by its own slots (queueapp/policy/resident_sets.py), on the studio config
that the simulator and `make run` serve."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from queueapp.policy import PolicySettings
from queueapp.policy.decide import GpuSnapshot, Outcome, Snapshot, decide
from queueapp.policy.resident_sets import ResidentSet, Room, Swap, routing_of_parts
from queueapp.policy.routing import routing_from_config, routing_parts
from tests.factories import NOW, candidate, studio_config

STUDIO = studio_config()
ROUTING = routing_from_config(STUDIO)


def studio(
    in_flight: dict[str, int], *, ready: set[str] = frozenset(), parallel=None
) -> GpuSnapshot:
    """The studio GPU with `in_flight` jobs per model (slots 0..n-1)."""
    models = [model for model, count in in_flight.items() for _ in range(count)]
    sets = ResidentSet(
        routing=ROUTING,
        running_names=frozenset(ready) | frozenset(in_flight),
        in_flight=Counter(models),
        parallel=parallel or {},
    )
    distinct = set(models)
    return GpuSnapshot(
        "gpu0",
        resident_models=frozenset(ready),
        slots_taken=frozenset(range(len(models))),
        in_flight_model=min(distinct) if len(distinct) == 1 else None,
        sets=sets,
    )


def decided(gpu: GpuSnapshot, *heads):
    return decide(Snapshot(now=NOW, gpu=gpu, heads=list(heads), settings=PolicySettings()))


def test_tts_starts_beside_a_chat_in_flight_and_unloads_nothing():
    gpu = studio({"chat-small": 1})
    decision = decided(gpu, candidate(1, model="tts-kokoro"))
    assert decision.outcome is Outcome.START
    assert (decision.chosen.candidate.job_id, decision.slot) == (1, 1)
    assert gpu.predicted_swap("tts-kokoro") == Swap("tts-kokoro", frozenset())


def test_an_image_drains_for_the_tts_it_unloads_but_not_for_the_chat_it_keeps():
    gpu = studio({"chat-small": 1, "tts-kokoro": 1})
    decision = decided(gpu, candidate(1, model="image-xl", band=100))
    assert decision.outcome is Outcome.DRAIN
    assert gpu.predicted_swap("image-xl") == Swap("image-xl", frozenset({"tts-kokoro"}))
    # Once the TTS job ends (the chat still runs), it starts beside the chat.
    after = studio({"chat-small": 1}, ready={"tts-kokoro"})
    started = decided(after, candidate(1, model="image-xl", band=100))
    assert started.outcome is Outcome.START
    assert after.predicted_swap("image-xl") == Swap("image-xl", frozenset({"tts-kokoro"}))


def test_during_a_drain_only_jobs_that_change_nothing_start():
    gpu = studio({"chat-small": 1, "tts-kokoro": 1}, parallel={"chat-small": 4})
    decision = decided(
        gpu,
        candidate(1, model="image-xl", band=100),
        candidate(2, model="tts-kokoro"),  # the image's load would unload it
        candidate(3, model="chat", waited=5),  # an alias of the chat: kept
        candidate(4, model="embed-small"),  # would load: it could add to the drain
    )
    assert decision.outcome is Outcome.START
    assert [entry.candidate.job_id for entry in decision.startable] == [3]
    assert decision.chosen.candidate.job_id == 3  # the job that starts leads the record


def test_a_model_at_its_cap_waits_for_its_own_slot_and_holds_up_nobody():
    # image-xl's concurrencyLimit is 1: its second job waits; a chat starts.
    gpu = studio({"image-xl": 1, "chat-small": 1}, parallel={"chat-small": 2})
    decision = decided(gpu, candidate(1, model="image-xl", band=100), candidate(2, model="chat"))
    assert decision.outcome is Outcome.START
    assert decision.chosen.candidate.job_id == 2
    alone = decided(gpu, candidate(1, model="image-xl", band=100))
    assert alone.outcome is Outcome.FULL
    # With the chat at its own cap too, no model could start: full before any head.
    assert studio({"image-xl": 1, "chat-small": 1}).free_slot() is None


def test_parallel_is_bounded_by_concurrency_limit():
    sets = studio({"chat-small": 4}, parallel={"chat-small": 8}).sets
    assert sets is not None
    assert sets.cap("chat") == 4  # concurrencyLimit 4 in studio.yaml
    assert sets.room("chat-small") is Room.OWN_SLOTS_FULL
    assert studio({"tts-kokoro": 1}).sets.cap("tts") == 1  # parallel 1 by default


def test_video_in_no_set_drains_for_everything_busy():
    gpu = studio({"chat-small": 1})
    assert decided(gpu, candidate(1, model="video-wan")).outcome is Outcome.DRAIN
    swap = gpu.predicted_swap("video-wan")
    assert swap == Swap("video-wan", frozenset({"chat-small"}))
    assert swap.sentence() == "loading video-wan unloads chat-small"


def test_a_gpu_is_full_only_when_no_model_could_start():
    assert studio({"video-wan": 1}).free_slot() is None
    assert studio({"chat-small": 1}).free_slot() == 1


def test_affinity_counts_every_running_model_and_its_aliases():
    gpu = studio({"chat-small": 1}, ready={"tts-kokoro"})
    assert {"chat", "tts", "chat-small", "tts-kokoro"} <= gpu.loaded


def test_without_sets_the_rule_is_one_model_at_a_time():
    gpu = GpuSnapshot("gpu0", slots_taken=frozenset({0}), in_flight_model="chat-small")
    assert decided(gpu, candidate(1, model="tts-kokoro")).outcome is Outcome.FULL
    assert gpu.predicted_swap("tts-kokoro") == Swap("tts-kokoro", frozenset({"chat-small"}))


@pytest.mark.parametrize("parts", [None, {}, {"models": {"a": {}}, "routing": "not a mapping"}])
def test_no_routing_or_an_unusable_one_gives_no_sets(parts):
    assert routing_of_parts(parts) is None


def test_recorded_parts_give_the_same_routing():
    assert routing_of_parts(routing_parts(STUDIO)) == ROUTING


def test_one_model_at_a_time_still_predicts_swaps_by_the_routing():
    gpu = studio({"chat-small": 1})
    one_at_a_time = replace(gpu, sets=replace(gpu.sets, side_by_side=False))
    assert decided(one_at_a_time, candidate(1, model="tts-kokoro")).outcome is Outcome.FULL
    # llama-swap keeps the chat beside the TTS all the same.
    assert one_at_a_time.predicted_swap("tts-kokoro") == Swap("tts-kokoro", frozenset())
