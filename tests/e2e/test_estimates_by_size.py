"""Estimates that follow the request's size, end to end: the simulator's
run time follows the body's size (its documented rule, written apart from
gpusched's reading of sizes), ten runs are learned through the real
cluster, and then a 360-frame and a 60-frame job of the same model get
estimates in the ratio the simulator runs them, shown in the job's API
answer and in `why`."""

from collections.abc import Iterator

import httpx
import pytest

from gpusched.stack import wait_for
from queueapp.upstream.simulator import LlamaSwapSimulator
from tests import factories
from tests.e2e.helpers import World, world_in_front_of

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

PATH = "/v1/images/generations"  # where a video server behind llama-swap takes requests
# The simulator's seconds for its reference request: 60 frames, 20 steps, 832×480.
REFERENCE_SECONDS = 0.4
# Ten runs of sizes spread as a day's shots are, both ends included.
LEARNING_FRAMES = (60, 360, 120, 240, 180, 60, 300, 120, 360, 240)


@pytest.fixture
def sized(transactional_db, tmp_path) -> Iterator[World]:
    """The stack in front of a simulator whose video model's run time follows the size."""
    simulator = LlamaSwapSimulator(
        models={"wan-video": REFERENCE_SECONDS}, size_scaled=True, swap_seconds=0.0
    ).start()
    with world_in_front_of(simulator, tmp_path) as world:
        yield world


def shot(frames: int) -> dict:
    return {"model": "wan-video", "prompt": "a fox", "num_frames": frames, "steps": 20}


def submit(web, token: str, frames: int) -> dict:
    created = httpx.post(
        f"{web.url}/api/jobs/",
        json={"path": PATH, "body": shot(frames)},
        headers={"Authorization": f"Bearer {token}"},
    )
    assert created.status_code == 201, created.text
    return created.json()


def job_answer(web, token: str, job_id: int, suffix: str = "") -> dict:
    answer = httpx.get(
        f"{web.url}/api/jobs/{job_id}/{suffix}", headers={"Authorization": f"Bearer {token}"}
    )
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_a_360_and_a_60_frame_shot_are_estimated_in_the_ratio_they_run(sized):
    sized.start_cluster()
    web = sized.start_web()
    _, token = factories.member("ann", "pro")
    learning = [submit(web, token, frames)["id"] for frames in LEARNING_FRAMES]
    wait_for(
        lambda: all(job_answer(web, token, j)["status"] == "succeeded" for j in learning),
        timeout=120,
        message=f"the {len(LEARNING_FRAMES)} learning runs to end",
    )
    runs = {e["body"]["num_frames"]: e["run_seconds"] for e in sized.simulator.log()}
    true_ratio = runs[360] / runs[60]

    long, short = submit(web, token, 360), submit(web, token, 60)

    long_expected, short_expected = long["expected_seconds"], short["expected_seconds"]
    assert long_expected["basis"] == short_expected["basis"] == "size"
    ratio = long_expected["p50"] / short_expected["p50"]
    assert ratio == pytest.approx(true_ratio, rel=0.25), (long_expected, short_expected, runs)
    assert long_expected["p90"] > long_expected["p50"]
    why = job_answer(web, token, long["id"], "why/")
    assert why["expected"]["basis"] == "size"
    assert "360 frames" in why["expected"]["text"] and "learned by size" in why["expected"]["text"]
