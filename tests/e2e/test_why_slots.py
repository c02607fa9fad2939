"""'Why did my job wait?' for jobs that shared a GPU, against real claims: the
simulator as a batching server (chat parallel 4) and the dispatcher cluster."""

from __future__ import annotations

import pytest

from gpusched.stack import wait_for
from queueapp import services
from queueapp.models import Job
from tests import factories
from tests.e2e.helpers import all_ended

pytestmark = [pytest.mark.e2e]


def why(api, token: str, job: Job) -> dict:
    response = api.as_member(token).get(f"/api/jobs/{job.pk}/why/")
    assert response.status_code == 200, response.content
    return response.json()


def assert_parts_add_up(answer: dict) -> None:
    assert answer["parts_total_seconds"] == pytest.approx(answer["measured_wait_seconds"], abs=0.01)
    for part in answer["parts"]:
        assert part["seconds"] + part.get("swap_seconds", 0.0) <= (
            answer["measured_wait_seconds"] + 0.001
        ), part


def test_an_image_waiting_for_chats_in_flight_is_told_the_drain(batching, api):
    services.model_parallel_set(name="chat", parallel=4)
    members = [factories.member(f"m{i}", "pro") for i in range(3)]
    batching.start_cluster()
    first = [factories.job(members[i][0], model="chat", seconds=1.5, label=f"c{i}") for i in (0, 1)]
    wait_for(
        lambda: Job.objects.filter(pk__in=[j.pk for j in first], status="running").count() == 2,
        message="two chats to run side by side",
    )
    image_owner, image_token = members[2]
    image = factories.job(image_owner, model="image", seconds=0.1, priority="interactive")
    later = factories.job(members[0][0], model="chat", seconds=0.1, label="later")
    wait_for(lambda: all_ended([*first, image, later]), timeout=60, message="every job to end")

    answer = why(api, image_token, image)
    assert_parts_add_up(answer)
    drains = [part for part in answer["parts"] if part["kind"] == "drain"]
    assert len(drains) == 1 and drains[0]["for_you"], answer["parts"]
    assert drains[0]["in_flight"] == 2 and drains[0]["model"] == "chat"
    assert {job["id"] for job in drains[0]["jobs"]} == {job.pk for job in first}
    assert "requests in flight to end before the swap to image" in answer["summary"]
    assert answer["in_flight"] == 1

    # The chat submitted after the image was held back while the GPU drained.
    answer = why(api, members[0][1], later)
    assert_parts_add_up(answer)
    kinds = [part["kind"] for part in answer["parts"]]
    assert "drain" in kinds and "dispatched_ahead" in kinds, answer["parts"]
    held = next(part for part in answer["parts"] if part["kind"] == "drain")
    assert held["swap_to"]["id"] == image.pk and not held["for_you"]

    # The second chat took a slot beside the first.
    second = max(first, key=lambda job: Job.objects.get(pk=job.pk).started_at)
    token = next(token for member, token in members if member.pk == second.member_id)
    answer = why(api, token, second)
    assert answer["in_flight"] == 2 and answer["slot"] == 1
    assert "beside 1 other chat job" in answer["summary"]
