"""A front-door caller who hangs up while its job runs: the model's
`on_caller_gone` closes the request (llama-server stops; the GPU goes to the
next job at once) or drains it (the render runs to its end; the GPU is
given to nobody until then). Daphne, the real cluster and the simulator,
whose log is the judge of what ran on the GPU at once."""

import threading

import httpx
import pytest

from gpusched.stack import wait_for
from queueapp.models import Job, JobEvent, JobStatus
from tests import factories
from tests.e2e.helpers import (
    HangingUpCaller,
    client_for,
    ended,
    requests_in_flight_together,
)

pytestmark = [pytest.mark.e2e]

RENDER_SECONDS = 3.0  # an image render its caller leaves early


def started_entry(simulator, path):
    """The simulator's log entry of the request on `path`, once it is admitted."""
    return wait_for(
        lambda: next(
            (e for e in simulator.log() if e["path"] == path and e["started_at"] is not None),
            None,
        ),
        message=f"the request on {path} to start at the simulator",
    )


def planned_end(entry):
    """When the simulator's request would end, run whole: its admission, cold load and run."""
    return entry["started_at"] + entry["load_seconds"] + entry["run_seconds"]


def entry_of(simulator, label):
    return next(e for e in simulator.log() if (e["body"] or {}).get("user") == label)


def next_caller(web, token, label, answers):
    """A fast chat call made at once, in a thread: the job that wants the GPU next."""

    def call():
        answers.append(
            client_for(web, token).chat.completions.create(model="chat-a", messages=[], user=label)
        )

    thread = threading.Thread(target=call)
    thread.start()
    return thread


def job_api(web, token, job_id):
    answer = httpx.get(
        f"{web.url}/api/jobs/{job_id}/", headers={"Authorization": f"Bearer {token}"}
    )
    assert answer.status_code == 200
    return answer.json()


def test_an_image_caller_who_leaves_mid_render_holds_the_gpu_until_the_render_ends(world):
    world.start_cluster()
    web = world.start_web()
    _, token = factories.member("ann-member", "pro")
    body = {"model": "image-model", "prompt": "a fox", "sim": {"seconds": RENDER_SECONDS}}
    caller = HangingUpCaller(web, token, "/v1/images/generations", body)
    render = started_entry(world.simulator, "/v1/images/generations")
    image_job = Job.objects.get(path="/v1/images/generations")
    caller.hang_up()

    answers: list = []
    following = next_caller(web, token, "next", answers)
    # The caller's leaving is recorded while the render goes on: the job still
    # holds the GPU (running, its lease renewed), and the next job waits.
    left = wait_for(
        lambda: Job.objects.filter(pk=image_job.pk, caller_left_at__isnull=False).first(),
        message="the caller's leaving to be recorded",
    )
    assert left.status == JobStatus.RUNNING
    shown = job_api(web, token, image_job.pk)
    assert shown["caller_left_at"] is not None and shown["drained_seconds"] is None
    following.join(timeout=30)
    assert answers and answers[0].choices[0].message.content

    image_job = ended(image_job.pk)
    log = world.simulator.log()
    rendered = next(e for e in log if e["seq"] == render["seq"])
    after = entry_of(world.simulator, "next")
    figures = {"render": rendered, "next": after, "job_finished_at": image_job.finished_at}
    # The render ran to its end (the simulator, as an image server, finished it),
    # and gpusched read its answer: no hang-up reached the simulator.
    assert rendered["status"] == 200 and rendered["finished_at"] >= planned_end(render), figures
    # The job ended after llama-swap answered, and only then was the GPU given on.
    assert image_job.finished_at.timestamp() >= planned_end(render), figures
    assert after["received_at"] >= planned_end(render) and after["status"] == 200, figures
    assert requests_in_flight_together(log) == 0, log

    assert image_job.status == JobStatus.FAILED
    assert "disconnected" in image_job.error and "discarded" in image_job.error
    assert image_job.caller_left_at is not None
    drained = image_job.finished_at - image_job.caller_left_at
    assert image_job.drained_seconds == pytest.approx(drained.total_seconds(), abs=1e-3)
    assert 0 < image_job.drained_seconds <= RENDER_SECONDS + 1, figures
    shown = job_api(web, token, image_job.pk)
    assert shown["status"] == "failed"
    assert shown["drained_seconds"] == pytest.approx(image_job.drained_seconds)
    assert shown["caller_left_at"] is not None
    kinds = list(image_job.events.values_list("kind", "detail__on_caller_gone"))
    assert (JobEvent.Kind.CALLER_LEFT, "drain") in kinds
    assert kinds[-1] == (JobEvent.Kind.FAILED, "drain")


def test_a_chat_caller_who_leaves_frees_the_gpu_at_once(world):
    world.start_cluster()
    web = world.start_web()
    _, token = factories.member("ann-member", "pro")
    body = {"model": "chat-a", "messages": [], "user": "left", "sim": {"seconds": 30.0}}
    caller = HangingUpCaller(web, token, "/v1/chat/completions", body)
    generation = started_entry(world.simulator, "/v1/chat/completions")
    chat_job = Job.objects.get(front_door=True)
    caller.hang_up()
    # llama-server stops when its connection closes: gpusched closed it (a
    # drain would keep it open, and the generation would run its 30 s). The
    # next call goes once the simulator has seen it, which refuses, unlike
    # llama-swap, a request that arrives while the slot is still in use.
    stopped = wait_for(
        lambda: (entry := entry_of(world.simulator, "left"))["status"] == 499 and entry,
        message="the generation to stop",
    )
    assert stopped["finished_at"] < planned_end(generation)

    answers: list = []
    next_caller(web, token, "next", answers).join(timeout=30)
    assert answers and answers[0].choices[0].message.content

    chat_job = ended(chat_job.pk)
    log = world.simulator.log()
    after = entry_of(world.simulator, "next")
    # The next job reached the GPU long before the generation would have ended.
    assert after["received_at"] < planned_end(generation) and after["status"] == 200, log
    assert requests_in_flight_together(log) == 0, log
    assert chat_job.status == JobStatus.FAILED and "disconnected" in chat_job.error
    shown = job_api(web, token, chat_job.pk)
    assert shown["caller_left_at"] is not None and shown["drained_seconds"] is None


def test_a_chat_model_set_to_drain_holds_the_gpu_until_its_stream_ends(world):
    world.start_cluster()
    web = world.start_web()
    _, staff = factories.member("boss", "pro", staff=True)
    headers = {"Authorization": f"Bearer {staff}"}
    changed = httpx.patch(
        f"{web.url}/api/models/chat-a/", json={"on_caller_gone": "drain"}, headers=headers
    )
    assert changed.status_code == 200 and changed.json()["on_caller_gone"] == "drain"
    body = {
        "model": "chat-a",
        "messages": [],
        "user": "left",
        "stream": True,
        "sim": {"seconds": RENDER_SECONDS},
    }
    with httpx.stream(
        "POST", f"{web.url}/v1/chat/completions", json=body, headers=headers, timeout=30
    ) as response:
        assert response.status_code == 200
        next(response.iter_raw())  # one chunk, then hang up
    generation = started_entry(world.simulator, "/v1/chat/completions")
    answers: list = []
    next_caller(web, staff, "next", answers).join(timeout=30)

    chat_job = ended(Job.objects.get(body__user="left").pk)
    log = world.simulator.log()
    streamed = entry_of(world.simulator, "left")
    after = entry_of(world.simulator, "next")
    # gpusched kept reading the stream, so the server generated to its end.
    assert streamed["status"] == 200 and streamed["finished_at"] >= planned_end(generation), log
    assert after["received_at"] >= planned_end(generation), log
    assert requests_in_flight_together(log) == 0, log
    assert chat_job.status == JobStatus.FAILED and "bytes of the stream" in chat_job.error
    assert chat_job.drained_seconds is not None and chat_job.drained_seconds > 0
