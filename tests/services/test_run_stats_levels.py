"""What jobs take by concurrency level (the jobs sharing the GPU as a run
started): a level's own average once learned, else derived from the nearest
learned level, else from the alone fallbacks, slowed as a batching server is."""

import pytest

from queueapp.durations import Durations
from queueapp.policy import batched_seconds
from queueapp.policy.expected import DEFAULT_RUN_SECONDS
from queueapp.services.run_stats import run_stats_record

CHAT = "/v1/chat/completions"


def record(model: str, seconds: float, *, concurrency: int = 1, path: str = CHAT) -> None:
    run_stats_record(
        model=model, path=path, seconds=seconds, swapped=False, concurrency=concurrency
    )


@pytest.mark.django_db
def test_learned_levels_are_used_as_learned():
    record("chat", 10)
    record("chat", 19, concurrency=4)
    durations = Durations.load()
    assert durations.run_seconds("chat", CHAT) == pytest.approx(10.0)
    assert durations.run_seconds("chat", CHAT, 1) == pytest.approx(10.0)
    assert durations.run_seconds("chat", CHAT, 4) == pytest.approx(19.0)


@pytest.mark.django_db
def test_an_unlearned_level_is_derived_from_the_nearest_learned_one():
    record("chat", 10)
    record("chat", 19, concurrency=4)
    durations = Durations.load()
    # Level 2 is nearer 1: 10 s slowed to two in flight.
    assert durations.run_seconds("chat", CHAT, 2) == pytest.approx(batched_seconds(10.0, 2))
    # Level 6 is nearer 4: 19 s scaled from four in flight to six.
    expected = 19.0 * batched_seconds(1.0, 6) / batched_seconds(1.0, 4)
    assert durations.run_seconds("chat", CHAT, 6) == pytest.approx(expected)


@pytest.mark.django_db
def test_a_path_learned_only_shared_gives_its_alone_time_by_the_same_rule():
    record("chat", 14.5, concurrency=4)
    assert Durations.load().run_seconds("chat", CHAT) == pytest.approx(14.5 / 1.45)


@pytest.mark.django_db
def test_with_nothing_learned_the_fallbacks_are_slowed_to_the_level():
    assert Durations.load().run_seconds("chat", CHAT, 3) == pytest.approx(
        batched_seconds(DEFAULT_RUN_SECONDS, 3)
    )
    record("chat", 10, path="/v1/completions")
    record("image", 30, path="/sdapi/v1/txt2img")
    durations = Durations.load()
    # The model's other paths, then every model's, as alone.
    assert durations.run_seconds("chat", CHAT, 2) == pytest.approx(batched_seconds(10.0, 2))
    assert durations.run_seconds("video", CHAT, 2) == pytest.approx(batched_seconds(20.0, 2))


@pytest.mark.django_db
def test_shared_runs_move_neither_the_alone_fallbacks_nor_the_short_models():
    record("chat", 10)
    record("chat", 80, concurrency=8)
    durations = Durations.load()
    # Another path of chat, and a model never seen: alone runs only.
    assert durations.run_seconds("chat", "/v1/completions") == pytest.approx(10.0)
    assert durations.run_seconds("video", CHAT) == pytest.approx(10.0)
    # A GPU reserved for runs under 60 s judges chat by its run alone.
    assert durations.models_shorter_than(60.0) == ["chat"]
