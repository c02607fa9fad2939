"""A GPU's parallel slots on the live dashboard, in headless Chromium against
a real Daphne server: a GPU that runs several jobs of its loaded model at
once shows its slots in use and its jobs (a few listed, the rest counted),
and follows a job's end without a reload; it still fits a phone. Its
resident set names each loaded model with its running jobs, what loads and
the requests from elsewhere.

No cluster runs: the test claims the slots itself, with the claim the
dispatcher makes, and ends a job as the dispatcher does."""

from __future__ import annotations

import pytest
from django.conf import settings

from queueapp import services
from queueapp.dispatch.claim import ClaimedJob, job_claim_next
from queueapp.dispatch.lease import job_end_durable
from queueapp.models import Gpu, Job, JobStatus
from queueapp.upstream.client import UpstreamAnswer
from queueapp.upstream.llama_swap_state import ModelsRunning
from tests import factories
from tests.e2e.browser import chromium, log_in, save_screenshot  # noqa: F401 (fixture)
from tests.e2e.helpers import PHONE, cards_that_scroll, outside_card

pytestmark = [pytest.mark.e2e]

CARD = ".gpu-card[data-gpu='gpu0']"


@pytest.fixture
def gpu0(world, dispatchers_alive) -> Gpu:
    """gpu0, healthy, chat-a loaded; no dispatcher process of its own (the
    test claims), but its lock held, as a live dispatcher holds it."""
    row = services.gpu_register(name="gpu0", url=world.simulator.url)
    services.gpu_state_record(
        gpu_id=row.pk, reachable=True, resident_model="chat-a", served_models=["chat-a", "chat-b"]
    )
    dispatchers_alive(row)
    return Gpu.objects.get(pk=row.pk)


def claim(gpu: Gpu) -> ClaimedJob:
    outcome = job_claim_next(resident_model="chat-a", worker="test", gpu=gpu.pk)
    assert isinstance(outcome, ClaimedJob), outcome
    return outcome


def succeed(claimed: ClaimedJob) -> None:
    """The job's end as the dispatcher records it (its event tells the dashboard)."""
    answer = UpstreamAnswer(
        status_code=200,
        content_type="application/json",
        content=b'{"choices": []}',
        retry_after=None,
    )
    assert job_end_durable(
        claim=claimed,
        answer=answer,
        error=None,
        inline_limit=settings.GPUSCHED_RESULT_INLINE_BYTES,
    )


def card_jobs(page) -> list[int]:
    """The job ids the card's lines link to."""
    return page.eval_on_selector_all(
        f"{CARD} .running a", "links => links.map(a => Number(a.textContent.slice(1)))"
    )


def wait_for_slots(page, text: str) -> None:
    page.wait_for_function(
        "([card, text]) => document.querySelector(card + ' .slots-used')?.textContent === text",
        arg=[CARD, text],
        timeout=10_000,
    )


def test_three_jobs_sharing_a_gpu_show_three_of_four_slots_and_an_end_frees_one(
    world,
    gpu0,
    chromium,  # noqa: F811
    tmp_path,
):
    services.model_parallel_set(name="chat-a", parallel=4)
    ann, token = factories.member("ann-member", "pro")
    jobs = [factories.job(ann, model="chat-a") for _ in range(3)]
    web = world.start_web()
    page = chromium.new_page(viewport={"width": 1280, "height": 900})
    try:
        log_in(page, web.url, token, "/")
        page.wait_for_selector("#connection:has-text('live')")
        # Idle, chat-a loaded: its four slots, none in use.
        wait_for_slots(page, "0 / 4")
        assert "idle" in page.inner_text(CARD)

        claims = [claim(gpu0) for _ in jobs]
        assert [c.gpu_slot for c in claims] == [0, 1, 2]  # one GPU, three slots
        wait_for_slots(page, "3 / 4")
        card = page.inner_text(CARD)
        assert "slots 3 / 4" in card and "last ends" in card, card
        assert card_jobs(page) == [job.pk for job in jobs]  # every job, by slot
        assert len(page.query_selector_all(f"{CARD} .slots-pips i.on")) == 3
        assert len(page.query_selector_all(f"{CARD} .slots-pips i")) == 4
        assert "more" not in card
        save_screenshot(page, "dashboard-slots.png", tmp_path)

        succeed(claims[1])
        wait_for_slots(page, "2 / 4")
        assert card_jobs(page) == [jobs[0].pk, jobs[2].pk]
        assert page.get_attribute(CARD, "data-jobs") == f"{jobs[0].pk} {jobs[2].pk}"
        assert len(page.query_selector_all(f"{CARD} .slots-pips i.on")) == 2
    finally:
        page.close()
    assert Job.objects.get(pk=jobs[1].pk).status == JobStatus.SUCCEEDED


def test_many_jobs_on_one_gpu_list_three_then_a_count_and_fit_a_phone(
    world,
    gpu0,
    chromium,  # noqa: F811
    tmp_path,
):
    services.model_parallel_set(name="chat-a", parallel=12)
    ann, token = factories.member("ann-member", "pro")
    jobs = [factories.job(ann, model="chat-a") for _ in range(10)]
    for _ in jobs:
        claim(gpu0)
    web = world.start_web()
    page = chromium.new_page(viewport=PHONE)
    try:
        log_in(page, web.url, token, "/")
        wait_for_slots(page, "10 / 12")
        # Twelve slots are one bar, not twelve pips; three jobs listed, the rest counted.
        assert page.query_selector(f"{CARD} .slots-bar") and not page.query_selector(
            f"{CARD} .slots-pips"
        )
        assert card_jobs(page) == [job.pk for job in jobs[:3]]
        assert page.inner_text(f"{CARD} .more-running") == "+7 more"
        assert page.get_attribute(CARD, "data-jobs") == " ".join(str(job.pk) for job in jobs)
        overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 0, f"the page is {overflow} px wider than a {PHONE['width']} px phone"
        assert outside_card(page, CARD) == []
        assert cards_that_scroll(page) == []
        save_screenshot(page, "dashboard-slots-phone.png", tmp_path)
    finally:
        page.close()


def test_the_card_names_every_resident_model_its_running_jobs_and_what_loads(
    world,
    gpu0,
    chromium,  # noqa: F811
    tmp_path,
):
    services.model_parallel_set(name="chat-a", parallel=4)
    services.gpu_state_record(
        gpu_id=gpu0.pk,
        reachable=True,
        resident_model="chat-a",
        running=ModelsRunning(
            ready=("chat-a", "chat-b", "embed-small"),
            loading=("image-xl",),
            latest_ready="chat-a",
            foreign_in_flight=1,
        ),
    )
    ann, token = factories.member("ann-member", "pro")
    claims = [claim(gpu0) for _ in [factories.job(ann, model="chat-a") for _ in range(2)]]
    # A job of a co-resident model beside them, in the next slot, as the
    # co-resident claim leaves it.
    beside = factories.job(ann, model="chat-b")
    Job.objects.filter(pk=beside.pk).update(
        status=JobStatus.RUNNING, is_lane_head=False, gpu=gpu0, gpu_slot=2
    )
    web = world.start_web()
    page = chromium.new_page(viewport={"width": 1280, "height": 900})
    try:
        log_in(page, web.url, token, "/")
        line = page.wait_for_selector(f"{CARD} .resident", timeout=10_000)
        assert line.inner_text() == (
            "loaded: chat-a (2 running), chat-b (1 running), embed-small"
            " · loading: image-xl · 1 request from elsewhere"
        )
        save_screenshot(page, "dashboard-resident-set.png", tmp_path)

        # A job's end reaches the line without a reload.
        succeed(claims[0])
        page.wait_for_function(
            "card => document.querySelector(card + ' .resident')?.textContent"
            ".startsWith('loaded: chat-a (1 running), chat-b (1 running)')",
            arg=CARD,
            timeout=10_000,
        )
    finally:
        page.close()
