"""The live dashboard in headless Chromium against a real Daphne server and
the real cluster: jobs appear, start and finish on the page without a reload,
on one GPU and on two."""

import time

import httpx
import pytest

from gpusched.stack import wait_for
from queueapp.models import Job, JobStatus
from queueapp.selectors import db_now
from tests import factories
from tests.e2e.browser import chromium, log_in, save_screenshot  # noqa: F401 (fixture)
from tests.e2e.helpers import e2e_simulator

pytestmark = [pytest.mark.e2e]


def submit(web, token, *, model="chat-a", seconds=None, priority=None, label=None):
    body = factories.chat_body(model, seconds)
    if label:
        body["user"] = label
    headers = {"Authorization": f"Bearer {token}"}
    if priority:
        headers["X-LlamaSwap-Priority"] = priority
    response = httpx.post(
        f"{web.url}/api/jobs/",
        json={"path": "/v1/chat/completions", "body": body},
        headers=headers,
    )
    assert response.status_code == 201, response.text
    return response.json()["id"]


def wait_until_shown(page, selector: str, timeout_s: float = 10) -> None:
    page.wait_for_selector(selector, timeout=timeout_s * 1000)


def test_jobs_appear_start_and_finish_without_a_reload(world, chromium):  # noqa: F811
    world.start_cluster()
    web = world.start_web()
    member, token = factories.member("ann-member", "pro")
    page = chromium.new_page()
    try:
        log_in(page, web.url, token, "/")
        page.wait_for_selector("#connection:has-text('live')")
        loads = []
        page.on("load", lambda: loads.append(time.time()))
        factories.policy(dispatch_paused=True)
        first = submit(web, token, seconds=1.0)
        second = submit(web, token, seconds=0.5)
        # Each change shows; how soon is a speed goal (benchmarks/websocket_fanout.py).
        wait_until_shown(page, f"#queue tr[data-job='{second}']")
        assert page.query_selector(f"#queue tr[data-job='{first}'].mine")
        # One GPU reads as one card, and start times name no GPU.
        assert len(page.query_selector_all(".gpu-card")) == 1
        assert "gpu0" not in page.inner_text("#queue")
        factories.policy(dispatch_paused=False)
        wait_until_shown(page, f".gpu-card[data-jobs~='{first}']")
        wait_until_shown(page, f".gpu-card[data-jobs~='{second}']")
        wait_for(
            lambda: Job.objects.filter(pk=second, status=JobStatus.SUCCEEDED).exists(),
            message="the second job to finish",
        )
        wait_until_shown(page, ".gpu-card[data-gpu='gpu0'][data-jobs='']")
        assert loads == []  # all of it without a reload
    finally:
        page.close()


def test_an_expired_job_leaves_the_queue_and_counts_in_its_band(world, chromium):  # noqa: F811
    world.start_cluster()
    web = world.start_web()
    _, token = factories.member("ann-member", "pro")
    factories.policy(dispatch_paused=True)
    page = chromium.new_page()
    try:
        log_in(page, web.url, token, "/")
        page.wait_for_selector("#connection:has-text('live')")
        job = submit(web, token, seconds=0.5)
        wait_until_shown(page, f"#queue tr[data-job='{job}']")
        Job.objects.filter(pk=job).update(wait_deadline=db_now())  # its bound passes now
        wait_for(
            lambda: Job.objects.get(pk=job).status == JobStatus.EXPIRED,
            message="the job to expire",
        )
        page.wait_for_selector(f"#queue tr[data-job='{job}']", state="detached")
        # Band 0's row: started · expired in the last hour.
        page.wait_for_function(
            "[...document.querySelectorAll('#bands tbody tr')]"
            ".some(r => r.children[3].innerText.trim() === '0 · 1')"
        )
    finally:
        page.close()


@pytest.fixture
def second_simulator():
    sim = e2e_simulator()
    yield sim
    sim.stop()


@pytest.mark.slow
def test_dashboard_under_load_with_two_gpus_three_bands_and_two_models(
    world,
    second_simulator,
    chromium,  # noqa: F811
    tmp_path,
):
    upstreams = f"gpu0={world.simulator.url},gpu1={second_simulator.url}"
    for name in ("gpu0", "gpu1"):
        world.start_cluster(upstream_url=upstreams, GPUSCHED_GPU=name)
    web = world.start_web(upstream_url=upstreams)
    _, ann_token = factories.member("ann-member", "pro")
    _, bob_token = factories.member("bob-member", "free")
    _, max_token = factories.member("max-member", "max")
    # A render on each GPU (two members: each may have one job running).
    submit(web, bob_token, model="chat-b", seconds=30, priority="batch", label="render")
    submit(web, max_token, model="chat-a", seconds=30, priority="batch", label="render")
    wait_for(
        lambda: Job.objects.filter(status=JobStatus.RUNNING).count() == 2,
        message="a render to run on each GPU",
    )
    factories.policy(dispatch_paused=True)
    tokens = [ann_token, bob_token, max_token]
    for index in range(12):
        band = ["interactive", "normal", "batch"][index % 3]
        submit(web, tokens[index % 3], model=["chat-a", "chat-b"][index % 2], priority=band)
    page = chromium.new_page(viewport={"width": 1280, "height": 900})
    try:
        log_in(page, web.url, ann_token, "/")
        page.wait_for_function("document.querySelectorAll('#queue tbody tr').length === 12")
        assert page.query_selector_all("#queue tbody tr.mine")
        first = page.query_selector("#queue tbody tr")
        link = first.query_selector("a").get_attribute("href")
        assert link == f"/jobs/{first.get_attribute('data-job')}/why/"  # each job → its why page
        assert "bob-member" not in page.content()
        for gpu in ("gpu0", "gpu1"):  # a card per GPU, each with its render
            card = page.inner_text(f".gpu-card[data-gpu='{gpu}'] .running")
            assert card.startswith("running #") and "ends in" in card, card
        save_screenshot(page, "dashboard.png", tmp_path)
        # The terms bars share one scale: a higher score is a longer bar.
        bars = page.eval_on_selector_all(
            "#queue tbody tr",
            "rows => rows.map(r => [parseFloat(r.children[4].innerText),"
            " [...r.querySelectorAll('.terms span')]"
            ".reduce((w, s) => w + s.getBoundingClientRect().width, 0)])",
        )
        widths = [width for _, width in sorted(bars)]
        # 2 px of slack per step: a term too small to see is still drawn 2 px wide.
        assert all(a <= b + 2 for a, b in zip(widths, widths[1:], strict=False)), sorted(bars)
        assert widths[-1] > 3 * widths[0], sorted(bars)  # the bands are told apart
        page.set_viewport_size({"width": 390, "height": 900})  # a phone
        page.wait_for_selector("#queue")
        overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 0, f"the page is {overflow} px wider than a 390 px phone"
        save_screenshot(page, "dashboard-phone.png", tmp_path)
    finally:
        page.close()
    Job.objects.filter(status=JobStatus.QUEUED).update(status=JobStatus.CANCELLED)
