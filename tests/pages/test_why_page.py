"""The why page draws the wait from its pieces (`answer["pieces"]`): each
piece as many equal bars side by side as the parts that shared it, one
colour per kind, so overlapping runs hide no part; the legend names the
kinds drawn; the table shows each part's shown tenths, which add up to the
measured wait; and the API, the page and the CLI tell one answer."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from rich.console import Console

from gpusched_client import Client, cli
from queueapp import pages
from queueapp.models import Job
from queueapp.pages import timeline
from tests import factories
from tests.pages.why_page import WhyPage, read_why_page, six_parts_over_shared_holds
from tests.why.timeline import Timeline, assert_the_answer_adds_up

pytestmark = pytest.mark.django_db


@pytest.fixture
def history(default_tiers) -> Timeline:
    return Timeline()


def api_answer(api, token: str, job_id: int) -> dict[str, Any]:
    response = api.as_member(token).get(f"/api/jobs/{job_id}/why/")
    assert response.status_code == 200, response.content
    return response.json()


def why_page(client, token: str, job_id: int) -> WhyPage:
    client.post("/login/", {"token": token})
    response = client.get(f"/jobs/{job_id}/why/")
    assert response.status_code == 200
    return read_why_page(response.content.decode())


def waiting_alone(history: Timeline) -> tuple[Job, str]:
    """Ann's job, queued an hour ago on a GPU that ran nothing since."""
    ann, token = factories.member("ann", "free")
    return history.submitted(ann, 0), token


def part_seconds(part: dict[str, Any]) -> float:
    return part["seconds"] + part.get("swap_seconds", 0.0)


def test_a_piece_shared_by_two_parts_is_drawn_as_two_equal_bars_side_by_side():
    """Seconds 0 to 1 are a's alone, 1 to 3 shared by a and b, 3 to 5 b's:
    a's bars add up to its 2 s, b's to its 3 s, its swap drawn over its
    first second."""
    moment = "2026-01-01T00:00:0{}+00:00".format
    answer = {
        "submitted_at": moment(0),
        "started_at": None,
        "finished_at": None,
        "as_of": moment(5),
        "measured_wait_seconds": 5.0,
        "parts": [
            {"kind": "running_when_submitted", "seconds": 2.0, "shown_seconds": 2.0},
            {
                "kind": "dispatched_ahead",
                "seconds": 2.0,
                "swap_seconds": 1.0,
                "shown_seconds": 3.0,
            },
        ],
        "pieces": [
            {"from": moment(0), "to": moment(1), "parts": [0]},
            {"from": moment(1), "to": moment(3), "parts": [0, 1]},
            {"from": moment(3), "to": moment(5), "parts": [1]},
        ],
    }

    drawn = timeline(answer)

    bars = [(bar["part"], bar["left"], bar["width"], bar["swap_width"]) for bar in drawn["bars"]]
    assert bars == [
        (0, 0.0, 20.0, 0.0),
        (0, 20.0, 20.0, 0.0),
        (1, 40.0, 20.0, 20.0),
        (1, 60.0, 40.0, 0.0),
    ]
    assert [item["kind"] for item in drawn["legend"]] == [
        "running_when_submitted",
        "dispatched_ahead",
        "swap",
    ]


def test_each_parts_bars_are_its_seconds_to_scale_and_add_up_to_the_wait(api, client, history):
    waiting, token = six_parts_over_shared_holds(history)
    answer = api_answer(api, token, waiting.pk)
    assert_the_answer_adds_up(answer)
    drawn = timeline(answer)
    total = drawn["total_seconds"]
    page = why_page(client, token, waiting.pk)

    for index, part in enumerate(answer["parts"]):
        share = 100 * part_seconds(part) / total
        widths = [bar["width"] for bar in drawn["bars"] if bar["part"] == index]
        assert sum(widths) == pytest.approx(share, abs=0.002), part
        # The page draws them so, in its units (0 to 1000).
        drawn_on_page = [bar.width for bar in page.wait_bars() if bar.part == index]
        assert sum(drawn_on_page) / 10 == pytest.approx(share, abs=0.01), part
    wait_share = 100 * answer["measured_wait_seconds"] / total
    assert sum(bar["width"] for bar in drawn["bars"] if bar["part"] is not None) == pytest.approx(
        wait_share, abs=1e-6
    )
    # The swap of the job dispatched ahead is drawn over the start of its bars.
    (ahead,) = [i for i, p in enumerate(answer["parts"]) if p.get("swap_seconds")]
    swaps = [bar.swap_width for bar in page.wait_bars() if bar.part == ahead]
    assert swaps[0] > 0
    assert sum(swaps) / 10 == pytest.approx(100 * 1.5 / total, abs=0.01)


def test_six_parts_over_overlapping_shared_holds_show_every_kind_in_its_own_colour(
    api, client, history
):
    """Drawn from the parts' from and to, the holds that overlap hid each
    other: a table of six parts showed a bar of two colours."""
    waiting, token = six_parts_over_shared_holds(history)
    answer = api_answer(api, token, waiting.pk)
    page = why_page(client, token, waiting.pk)

    kinds = [part["kind"] for part in answer["parts"]]
    assert len(kinds) == 6
    assert set(kinds) == {
        "running_when_submitted",
        "dispatched_ahead",
        "own_earlier_attempt",
        "upstream_unavailable",
        "gpu_idle",
    }
    bars = page.wait_bars()
    assert {bar.part for bar in bars} == set(range(len(kinds)))
    assert all(kinds[bar.part] == bar.kind for bar in bars)
    colours: dict[str, set[str]] = {}
    for bar in page.bars:
        colours.setdefault(bar.kind, set()).add(bar.colour)
    assert all(len(each) == 1 for each in colours.values()), colours
    assert len({colour for each in colours.values() for colour in each}) == len(colours)
    drawn = set(colours) | ({"swap"} if any(bar.swap_width for bar in bars) else set())
    assert {kind for kind, _ in page.legend} == drawn == {*kinds, "swap", "own_run"}
    assert ("own_earlier_attempt", "your own earlier attempt") in page.legend


def test_the_legend_names_only_the_kinds_drawn(api, client, history):
    waiting, token = waiting_alone(history)
    page = why_page(client, token, waiting.pk)
    assert {bar.kind for bar in page.bars} == {"gpu_idle"}
    assert page.legend == [("gpu_idle", "GPU idle")]


def test_the_table_shows_each_parts_shown_seconds_and_the_measured_wait(api, client, history):
    waiting, token = six_parts_over_shared_holds(history)
    answer = api_answer(api, token, waiting.pk)
    page = why_page(client, token, waiting.pk)

    assert [kind for kind, _ in page.rows] == [part["kind"] for part in answer["parts"]]
    for (_, cells), part in zip(page.rows, answer["parts"], strict=True):
        assert cells[1].split()[0] == f"{part['shown_seconds']:.1f}", cells
    labels = {kind: cells[0] for kind, cells in page.rows}
    assert labels["own_earlier_attempt"] == "your own earlier attempt"
    # The first job dispatched ahead loaded its model first.
    kind, cells = page.rows[1]
    assert (kind, cells[1]) == ("dispatched_ahead", "3.5 (of which 1.5 swap)")
    assert answer["shown_wait_seconds"] == 15.0
    assert page.total[:2] == ["measured wait", "15.0"]
    assert page.warning is None
    assert 'the page "how the wait is cut"' in page.text


def test_parts_that_miss_the_wait_are_shown_with_a_warning(client, history, monkeypatch):
    """A cut that does not tile the wait is a defect (`adds_up` false): the
    page says so where it cannot be missed."""
    told = pages.job_why

    def missing(**arguments: Any) -> dict[str, Any]:
        return {**told(**arguments), "adds_up": False}

    monkeypatch.setattr(pages, "job_why", missing)
    waiting, token = waiting_alone(history)
    page = why_page(client, token, waiting.pk)
    assert page.warning is not None and "do not add up to the wait" in page.warning


def cli_rows(output: str) -> list[tuple[str, str]]:
    """The `why` table's rows as (part, seconds), its total row last."""
    rows = []
    for line in output.splitlines():
        cells = [cell.strip() for cell in re.split(r"[│┃]", line)[1:-1]]
        if len(cells) == 4 and cells[1] and cells[1] != "seconds":
            rows.append((cells[0], cells[1]))
    return rows


def test_the_api_the_page_and_the_cli_agree_part_for_part_on_a_finished_job(
    api, client, history, monkeypatch
):
    waiting, token = six_parts_over_shared_holds(history)
    answer = api_answer(api, token, waiting.pk)
    assert answer["status"] == "succeeded"
    page = why_page(client, token, waiting.pk)

    def through_the_api(request: httpx.Request) -> httpx.Response:
        response = api.as_member(token).get(request.url.path, dict(request.url.params))
        return httpx.Response(response.status_code, content=response.content)

    monkeypatch.setattr(
        cli,
        "Client",
        lambda url, token: Client(url, token, transport=httpx.MockTransport(through_the_api)),
    )
    monkeypatch.setattr(cli, "console", Console(width=400))
    result = CliRunner(env={"GPUSCHED_TOKEN": token}).invoke(cli.main, ["why", str(waiting.pk)])
    assert result.exit_code == 0, result.output

    told = [(part["kind"], f"{part['shown_seconds']:.1f}") for part in answer["parts"]]
    on_page = [(kind, cells[1].split()[0]) for kind, cells in page.rows]
    in_cli = [
        (kind.replace(" ", "_"), seconds.split()[0]) for kind, seconds in cli_rows(result.output)
    ]
    total = f"{answer['shown_wait_seconds']:.1f}"
    assert on_page == told
    assert in_cli == [*told, ("measured_wait", total)]
    assert page.total[:2] == ["measured wait", total]
    assert "do not add up" not in result.output
