"""The dashboard with a thousand queued jobs and two GPUs, in headless
Chromium against a real Daphne server: the page stays within three screens,
nothing is wider than a phone, a long model name stays inside its card, each
GPU has its card, the rest of the queue is reached by paging, and a new job
still shows up live."""

from __future__ import annotations

import time

import pytest

from queueapp import services
from queueapp.dashboard import LIVE_OWN_FURTHER, LIVE_QUEUE_HEAD
from queueapp.models import Job, JobStatus
from tests import factories
from tests.e2e.browser import chromium, log_in  # noqa: F401 (fixture)
from tests.e2e.helpers import PHONE, cards_that_scroll, outside_card

pytestmark = [pytest.mark.e2e]

QUEUED = 1000
LONG_MODEL = "mistral-small-3.1-24b-instruct-2503-q4km"
SCREEN = {"width": 1280, "height": 900}


def listed(page, attribute: str, rows: str = "#queue tbody tr[data-job]") -> list[int]:
    return page.eval_on_selector_all(rows, f"rows => rows.map(r => Number(r.dataset.{attribute}))")


def wait_for_first_position(page, position: int) -> None:
    page.wait_for_function(
        "position => document.querySelector('#queue tbody tr[data-job]')"
        "?.dataset.position === String(position)",
        arg=position,
    )


@pytest.fixture
def big_queue(world, dispatchers_alive):
    """Two GPUs (one with the long-named model loaded and a reservation), and
    a thousand queued jobs of three members; ann's are at the head (the long
    model), in the normal band among the others' (so some are further back
    than the head), and in the lowest band, behind everything."""
    assert len(LONG_MODEL) == 40
    factories.policy(dispatch_paused=True)
    for name, resident in (("gpu0", "chat-a"), ("gpu1", LONG_MODEL)):
        gpu = services.gpu_register(name=name, url=world.simulator.url)
        services.gpu_state_record(gpu_id=gpu.pk, reachable=True, resident_model=resident)
        dispatchers_alive(gpu)  # as its dispatcher would: held, paused
    services.gpu_update(
        gpu=services.gpu_register(name="gpu1", url=world.simulator.url),
        enabled=True,
        allowed_models=[],
        min_band=100,
        max_expected_seconds=90,
    )
    ann, ann_token = factories.member("ann-member", "pro")
    others = [factories.member(name, tier)[0] for name, tier in (("bob", "free"), ("cat", "max"))]
    started = time.monotonic()
    ann_jobs = {"interactive": 5, "normal": 60, "-200": 10}
    for band, count in ann_jobs.items():
        model = LONG_MODEL if band == "interactive" else "chat-a"
        for _ in range(count):
            factories.job(ann, priority=band, model=model)
    for index in range(QUEUED - sum(ann_jobs.values())):
        band = ["normal", "batch"][index % 2]
        factories.job(others[index % 2], priority=band, model=["chat-a", "chat-b"][index % 2])
    assert Job.objects.filter(status=JobStatus.QUEUED).count() == QUEUED
    print(f"{QUEUED} jobs queued in {time.monotonic() - started:.1f} s")
    return ann, ann_token


def test_a_thousand_queued_jobs_fit_three_screens_and_a_phone(world, big_queue, chromium):  # noqa: F811
    ann, token = big_queue
    web = world.start_web()
    page = chromium.new_page(viewport=SCREEN)
    try:
        log_in(page, web.url, token, "/")
        page.wait_for_selector("#connection:has-text('live')")
        page.wait_for_selector("#queue tbody tr[data-job]")

        height = page.evaluate("document.documentElement.scrollHeight")
        print(f"page height at 1280x900 with {QUEUED} queued: {height} px")
        assert height <= 3 * SCREEN["height"], f"the page is {height} px high"

        # The head of the queue, then ann's own jobs further back, not a thousand rows.
        positions = listed(page, "position")
        assert positions[:LIVE_QUEUE_HEAD] == list(range(1, LIVE_QUEUE_HEAD + 1))
        further = positions[LIVE_QUEUE_HEAD:]
        assert len(further) == LIVE_OWN_FURTHER and further == sorted(further), further
        mine = listed(page, "position", "#queue tbody tr.mine[data-job]")
        assert set(further) <= set(mine)
        assert page.inner_text("#queued-total") == f"({QUEUED})"
        summary = page.inner_text("#queue-summary")
        assert "band +100: 5" in summary and "band -200: 10" in summary, summary
        assert "yours: 75 queued" in summary, summary
        members = page.inner_text("#members")
        assert "ann-member" in members and members.count("another member") == 2, members
        assert "bob" not in page.content() and "cat" not in members

        # A card per GPU: health, loaded model (the long name cut short,
        # whole in its title), reservation.
        gpu0 = page.inner_text(".gpu-card[data-gpu='gpu0']")
        gpu1 = page.inner_text(".gpu-card[data-gpu='gpu1']")
        assert "healthy" in gpu0 and "chat-a" in gpu0, gpu0
        assert "reserved: band +100 and above" in gpu1, gpu1
        assert page.get_attribute(".gpu-card[data-gpu='gpu1'] .model", "title") == LONG_MODEL
        assert outside_card(page, ".gpu-card[data-gpu='gpu1']") == []

        # The long model name in the queue: cut short in place, the score
        # bars and start times still inside the card.
        long_row = f"#queue tbody tr[data-model='{LONG_MODEL}']"
        assert page.get_attribute(f"{long_row} .model", "title") == LONG_MODEL
        assert outside_card(page, "#queue-card") == []
        assert cards_that_scroll(page) == []

        # Paging reaches the rest of the queue, then back to the live head.
        page.click("#queue-next")
        wait_for_first_position(page, 51)
        assert listed(page, "position") == list(range(51, 101))
        page.click("#queue-next")
        wait_for_first_position(page, 101)
        assert outside_card(page, "#queue-card") == []
        page.click("#queue-head")
        wait_for_first_position(page, 1)

        # Still live at a thousand queued: a new interactive job shows at once.
        job = factories.job(ann, priority="interactive", model="chat-a")
        page.wait_for_selector(f"#queue tbody tr.mine[data-job='{job.pk}']", timeout=10_000)

        page.set_viewport_size(PHONE)
        page.wait_for_selector("#queue")
        overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        print(f"at {PHONE['width']} px the page is {overflow} px wider than the screen")
        assert overflow <= 0, f"the page is {overflow} px wider than a {PHONE['width']} px phone"
        assert outside_card(page, "#queue-card") == []
        assert outside_card(page, ".gpu-card[data-gpu='gpu1']") == []
        assert cards_that_scroll(page) == []
    finally:
        page.close()
