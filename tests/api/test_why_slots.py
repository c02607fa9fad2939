"""`GET /api/jobs/{id}/why/` when jobs share a GPU (a model with parallel
slots): each instant of the wait counts once, a job that started in a slot
says so, and the time a GPU drains before a swap is its own part.

The GPU's history is written as rows (jobs, their decisions, their runs) at
chosen seconds, so every part's length is known exactly."""

import pytest

from queueapp import services
from queueapp.models import DispatchDecision, Gpu, Job, Tier
from tests import factories
from tests.why.timeline import Timeline

pytestmark = pytest.mark.django_db


@pytest.fixture
def timeline(default_tiers) -> Timeline:
    services.model_parallel_set(name="chat-small", parallel=4)
    return Timeline()


def why(api, token: str, job: Job) -> dict:
    response = api.as_member(token).get(f"/api/jobs/{job.pk}/why/")
    assert response.status_code == 200, response.content
    return response.json()


def kinds(answer: dict, kind: str) -> list[dict]:
    return [part for part in answer["parts"] if part["kind"] == kind]


def assert_each_instant_counts_once(answer: dict, measured: float) -> None:
    assert answer["measured_wait_seconds"] == pytest.approx(measured, abs=0.002)
    assert answer["parts_total_seconds"] == pytest.approx(measured, abs=0.005)
    for part in answer["parts"]:
        counted = part["seconds"] + part.get("swap_seconds", 0.0)
        assert 0 <= counted <= measured + 0.001, part
        assert counted <= part.get("wall_seconds", counted) + 0.001, part


def test_jobs_running_at_once_share_each_instant_so_the_parts_add_up_to_the_wait(api, timeline):
    ann, token = factories.member("ann", "free")
    bob, _ = factories.member("bob", "max")
    chats = [timeline.submitted(bob, -10 + n, priority="interactive") for n in range(5)]
    a, b, c, d, e = chats
    timeline.ran(a, -3, 4, slot=0, in_flight=1)
    timeline.ran(b, -2, 5, slot=1, in_flight=2)
    timeline.ran(c, -1, 9, slot=2, in_flight=3)
    waiting = timeline.submitted(ann, 0, priority="batch")
    # All four slots taken: d at 1, then e in the slot a left.
    timeline.ran(d, 1, 9, slot=3, in_flight=4)
    timeline.ran(e, 4, 9, slot=0, in_flight=4)
    timeline.ran(waiting, 5, 8, slot=1, in_flight=4)

    answer = why(api, token, waiting)

    assert_each_instant_counts_once(answer, 5.0)
    by_job = {part["job"]["id"]: part for part in answer["parts"] if "job" in part}
    # 0-1: a, b, c; 1-4: a, b, c, d; 4-5: b, c, d, e.
    assert by_job[a.pk]["seconds"] == pytest.approx(1 / 3 + 3 / 4, abs=0.001)
    assert by_job[b.pk]["seconds"] == pytest.approx(1 / 3 + 3 / 4 + 1 / 4, abs=0.001)
    assert by_job[d.pk]["seconds"] + by_job[d.pk]["swap_seconds"] == pytest.approx(1.0, abs=0.001)
    assert by_job[e.pk]["seconds"] == pytest.approx(0.25, abs=0.001)
    assert [by_job[job.pk]["kind"] for job in chats] == ["running_when_submitted"] * 3 + [
        "dispatched_ahead"
    ] * 2
    # Each shows its own run inside the wait next to its share of it.
    assert (by_job[a.pk]["wall_seconds"], by_job[a.pk]["shared_with"]) == (4.0, 3)
    assert sum(part["wall_seconds"] for part in by_job.values()) == pytest.approx(19.0)
    assert by_job[d.pk]["deciding_term"] == "band"
    assert not kinds(answer, "drain") and not kinds(answer, "gpu_idle")
    assert "3 jobs already running" in answer["summary"]
    assert "Jobs that ran at once share the time they ran." in answer["summary"]


def test_a_job_that_started_in_a_slot_says_which_and_how_many_shared_the_gpu(api, timeline):
    ann, token = factories.member("ann", "free")
    bob, _ = factories.member("bob", "free")
    first = timeline.submitted(bob, -5)
    second = timeline.submitted(bob, -4)
    timeline.ran(first, -2, 10, slot=0, in_flight=1)
    timeline.ran(second, -1, 10, slot=1, in_flight=2)
    waiting = timeline.submitted(ann, 0)
    timeline.ran(waiting, 0.5, 3, slot=2, in_flight=3)

    answer = why(api, token, waiting)

    assert (answer["slot"], answer["in_flight"]) == (2, 3)
    assert (
        "It started in slot 2, beside 2 other chat-small jobs on the GPU (chat-small runs 4 at "
        "once, as the operator set)." in answer["summary"]
    )
    assert_each_instant_counts_once(answer, 0.5)
    running = kinds(answer, "running_when_submitted")
    assert [part["seconds"] for part in running] == [0.25, 0.25]
    assert all(part["shared_with"] == 1 for part in running)


def test_a_job_alone_on_its_gpu_says_slot_0_of_1_and_nothing_about_sharing(api, timeline):
    ann, token = factories.member("ann", "free")
    waiting = timeline.submitted(ann, 0)
    timeline.ran(waiting, 1, 2)
    answer = why(api, token, waiting)
    assert (answer["slot"], answer["in_flight"]) == (0, 1)
    assert "slot" not in answer["summary"] and "share" not in answer["summary"]
    assert [part["kind"] for part in answer["parts"]] == ["gpu_idle"]

    queued = why(api, token, timeline.submitted(ann, 3))
    assert (queued["slot"], queued["in_flight"]) == (None, None)


def test_a_job_of_another_model_waits_for_the_requests_in_flight_to_drain(api, timeline):
    ann, token = factories.member("ann", "free")
    bob, _ = factories.member("bob", "free")
    a, b, c = (timeline.submitted(bob, -5 + n) for n in range(3))
    timeline.ran(a, -3, 2, slot=0, in_flight=1)
    timeline.ran(b, -2, 4, slot=1, in_flight=2)
    timeline.ran(c, -1, 6, slot=2, in_flight=3)
    image = timeline.submitted(ann, 0, model="image")
    timeline.ran(image, 6, 20, swap=True)

    answer = why(api, token, image)

    assert_each_instant_counts_once(answer, 6.0)
    (drain,) = answer["parts"]
    assert drain["kind"] == "drain"
    assert drain["seconds"] == 6.0
    assert drain["intervals"] == [
        {"from": timeline.at(0).isoformat(), "to": timeline.at(6).isoformat()}
    ]
    assert (drain["model"], drain["in_flight"], drain["for_you"]) == ("chat-small", 3, True)
    assert [job["id"] for job in drain["jobs"]] == [a.pk, b.pk, c.pk]
    assert drain["reason"].startswith(
        "waiting for 3 chat-small requests in flight to end before the swap to image"
    )
    assert (
        "6.0 s waiting for 3 chat-small requests in flight to end before the swap to image"
        in (answer["summary"])
    )
    assert answer["in_flight"] == 1


def test_a_chat_dispatched_ahead_into_a_slot_lengthens_the_drain_and_keeps_its_terms(api, timeline):
    ann, token = factories.member("ann", "free")
    bob, _ = factories.member("bob", "free")
    a, b, c, late = (timeline.submitted(bob, -5 + n) for n in range(4))
    timeline.ran(a, -3, 2, slot=0, in_flight=1)
    timeline.ran(b, -2, 4, slot=1, in_flight=2)
    timeline.ran(c, -1, 6, slot=2, in_flight=3)
    image = timeline.submitted(ann, 0, model="image")
    timeline.ran(late, 1, 7, slot=3, in_flight=4)  # its model was loaded: it went first
    timeline.ran(image, 7, 20, swap=True)

    answer = why(api, token, image)

    assert_each_instant_counts_once(answer, 7.0)
    running = kinds(answer, "running_when_submitted")
    assert [part["seconds"] for part in running] == pytest.approx([1 / 3] * 3, abs=0.001)
    (ahead,) = kinds(answer, "dispatched_ahead")
    assert ahead["job"]["id"] == late.pk and ahead["deciding_term"] == "swap_affinity"
    # All of its time in the wait was the drain's: it counts there, once.
    assert (ahead["seconds"], ahead["wall_seconds"], ahead["shared_with"]) == (0.0, 6.0, 3)
    (drain,) = kinds(answer, "drain")
    assert (drain["seconds"], drain["in_flight"]) == (6.0, 4)
    assert "(1 of them dispatched ahead of yours)" in answer["summary"]


def test_a_chat_held_back_while_the_gpu_drains_for_a_higher_scored_image_job(api, timeline):
    ann, token = factories.member("ann", "free")
    bob, _ = factories.member("bob", "free")
    cat, _ = factories.member("cat", "free")
    a, b = timeline.submitted(bob, -5), timeline.submitted(bob, -4)
    timeline.ran(a, -2, 3, slot=0, in_flight=1)
    timeline.ran(b, -1, 4, slot=1, in_flight=2)
    waiting = timeline.submitted(ann, 0, priority="batch")
    image = timeline.submitted(cat, 0.5, model="image", priority="interactive")
    timeline.ran(image, 4, 10, swap=True)
    timeline.ran(waiting, 10, 12, swap=True)

    answer = why(api, token, waiting)

    assert_each_instant_counts_once(answer, 10.0)
    (drain,) = kinds(answer, "drain")
    assert drain["seconds"] == 4.0 and drain["for_you"] is False
    assert drain["swap_to"]["id"] == image.pk
    assert drain["reason"].startswith("held back while the GPU drained for a higher-scored image")
    (ahead,) = kinds(answer, "dispatched_ahead")
    assert ahead["job"]["id"] == image.pk and ahead["deciding_term"] == "band"
    assert ahead["seconds"] + ahead["swap_seconds"] == pytest.approx(6.0, abs=0.001)
    assert (
        "4.0 s held back while the GPU drained 2 chat-small requests before the swap to image"
        in (answer["summary"])
    )


def test_a_queued_job_of_another_model_is_told_the_drain_up_to_now(api, timeline):
    ann, token = factories.member("ann", "free")
    bob, _ = factories.member("bob", "free")
    a, b = timeline.submitted(bob, -5), timeline.submitted(bob, -4)
    timeline.ran(a, -2, None, slot=0, in_flight=1)
    timeline.ran(b, -1, None, slot=1, in_flight=2)
    image = timeline.submitted(ann, 0, model="image")

    answer = why(api, token, image)

    assert answer["still_waiting"] and answer["slot"] is None
    assert answer["parts_total_seconds"] == pytest.approx(
        answer["measured_wait_seconds"], abs=0.005
    )
    (drain,) = answer["parts"]
    assert drain["kind"] == "drain" and drain["swap_to"] is None
    assert drain["reason"] == "waiting for 2 chat-small requests in flight to end before the swap"
    assert answer["summary"].startswith("Waiting for ")


def two_at_once_on_gpu1(timeline, member) -> None:
    """Two of `member`'s jobs sharing another GPU, gpu1: 0-4 s and 1-5 s
    (the second in slot 1)."""
    other = Gpu.objects.get(pk=services.gpu_register(name="gpu1", url="http://127.0.0.1:9/g1").pk)
    first, second = timeline.submitted(member, -5), timeline.submitted(member, -4)
    timeline.ran(first, 0, 4)
    timeline.ran(second, 1, 5, slot=1, in_flight=2)
    Job.objects.filter(pk__in=[first.pk, second.pk]).update(gpu=other)
    DispatchDecision.objects.filter(job__in=[first, second]).update(gpu=other)


def test_busy_seconds_of_another_gpu_count_jobs_that_ran_at_once_once(api, timeline):
    ann, token = factories.member("ann", "free")
    bob, _ = factories.member("bob", "free")
    two_at_once_on_gpu1(timeline, bob)
    waiting = timeline.submitted(ann, 0)
    timeline.ran(waiting, 6, 7)

    answer = why(api, token, waiting)

    (entry,) = answer["other_gpus"]
    assert (entry["gpu"], entry["jobs"], entry["busy_seconds"]) == ("gpu1", 2, 5.0)


@pytest.mark.parametrize(("limit", "held"), [(1, 5.0), (2, 0.0)])
def test_the_running_limit_counts_a_members_jobs_sharing_one_gpu_as_one(api, timeline, limit, held):
    Tier.objects.filter(name="free").update(max_running_jobs=limit)
    ann, token = factories.member("ann", "free")
    two_at_once_on_gpu1(timeline, ann)
    waiting = timeline.submitted(ann, 0)
    timeline.ran(waiting, 6, 7)

    answer = why(api, token, waiting)

    assert_each_instant_counts_once(answer, 6.0)
    limited = kinds(answer, "running_limit")
    assert (limited[0]["seconds"] if limited else 0.0) == held
    assert kinds(answer, "gpu_idle")[0]["seconds"] == 6.0 - held


def test_the_why_page_draws_a_drain_as_a_bar_of_its_own(client, timeline):
    ann, token = factories.member("ann", "free")
    bob, _ = factories.member("bob", "free")
    chat = timeline.submitted(bob, -5)
    timeline.ran(chat, -1, 3, slot=0, in_flight=1)
    image = timeline.submitted(ann, 0, model="image")
    timeline.ran(image, 3, 5, swap=True)

    client.post("/login/", {"token": token})
    page = client.get(f"/jobs/{image.pk}/why/")
    assert page.status_code == 200
    assert 'data-kind="drain"' in page.content.decode()
