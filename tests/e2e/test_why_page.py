"""The "why" page in a real headless Chromium: summary, timeline, terms."""

import pytest

from tests import factories
from tests.e2e.browser import chromium, log_in, save_screenshot  # noqa: F401 (fixture)
from tests.e2e.helpers import make_resident, release_and_wait

pytestmark = [pytest.mark.e2e]


def test_the_why_page_shows_the_timeline_and_the_terms(world, live_server, chromium, tmp_path):  # noqa: F811
    world.start_cluster()
    free, token = factories.member("fay-freeman", "free")
    pro, _ = factories.member("pat-promember", "pro")
    other, _ = factories.member("olga-other", "max")
    make_resident(world, other, "chat-a")
    factories.policy(dispatch_paused=True)
    mine = factories.job(free, priority="batch", model="chat-b", label="mine")
    factories.job(pro, priority="interactive", model="chat-a", seconds=0.6, label="urgent")
    factories.job(pro, priority="batch", model="chat-a", seconds=0.4, label="pro-batch")
    assert release_and_wait(world, 3) == ["urgent", "pro-batch", "mine"]

    page = chromium.new_page(viewport={"width": 1100, "height": 900})
    try:
        log_in(page, live_server.url, token, f"/jobs/{mine.pk}/why/")
        page.wait_for_selector("#timeline")
        summary = page.inner_text("#summary")
        assert summary.startswith("Waited ")
        assert "band +100 vs your -100" in summary
        bars = page.query_selector_all("#timeline g.bar")
        assert len(bars) >= 2
        kinds = {bar.get_attribute("data-kind") for bar in bars}
        assert {"dispatched_ahead", "own_run"} <= kinds
        markers = page.query_selector_all("#timeline g.marker")
        assert [m.get_attribute("data-label") for m in markers] == [
            "submitted",
            "started",
            "finished",
        ]
        rows = page.inner_text("#parts tbody")
        assert "a higher band" in rows
        assert "pat-promember" not in page.content()  # another member's name stays hidden
        save_screenshot(page, "why-page.png", tmp_path)
    finally:
        page.close()
