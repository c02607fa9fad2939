"""The why page read back as its reader sees it: the timeline's bars (kind,
part, colour, width), the legend, the parts table's rows and its total,
and the warning; and a history whose holds overlap, shared by six parts."""

from __future__ import annotations

from dataclasses import dataclass, field
from html.parser import HTMLParser

from queueapp.models import Job, ModelSetting, RunStats
from tests import factories
from tests.why.timeline import Timeline


@dataclass
class Bar:
    kind: str
    part: int | None
    colour: str = ""
    width: float = 0.0  # in the drawing's units, 0 to 1000
    swap_width: float = 0.0


@dataclass
class WhyPage:
    bars: list[Bar] = field(default_factory=list)
    legend: list[tuple[str, str]] = field(default_factory=list)  # (kind, label)
    rows: list[tuple[str, list[str]]] = field(default_factory=list)  # (kind, cells)
    total: list[str] = field(default_factory=list)
    warning: str | None = None
    text: str = ""

    def wait_bars(self) -> list[Bar]:
        return [bar for bar in self.bars if bar.part is not None]


class _Reader(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.page = WhyPage()
        self._in: list[str] = []  # what the text read now belongs to
        self._cells: list[str] | None = None
        self._legend_kind: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        at = {name: value or "" for name, value in attrs}
        if tag == "g" and at.get("class") == "bar":
            part = at.get("data-part")
            self.page.bars.append(Bar(at["data-kind"], int(part) if part is not None else None))
        elif tag == "rect" and at.get("class") == "fill":
            self.page.bars[-1].colour = at["fill"]
            self.page.bars[-1].width = float(at["width"])
        elif tag == "rect" and at.get("class") == "swap":
            self.page.bars[-1].swap_width = float(at["width"])
        elif tag == "p" and at.get("id") in ("legend", "adds-up-warning"):
            self._in.append(at["id"])
            if at["id"] == "adds-up-warning":
                self.page.warning = ""
        elif tag == "span" and self._in[-1:] == ["legend"] and "data-kind" in at:
            self._legend_kind = at["data-kind"]
            self.page.legend.append((at["data-kind"], ""))
        elif tag in ("tbody", "tfoot"):
            self._in.append(tag)
        elif tag == "tr" and self._in[-1:] in (["tbody"], ["tfoot"]):
            self._cells = []
            if self._in[-1] == "tbody":
                self.page.rows.append((at.get("data-kind", ""), self._cells))
            else:
                self.page.total = self._cells
        elif tag in ("td", "th") and self._cells is not None:
            self._cells.append("")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("tbody", "tfoot") or (
            tag == "p" and self._in[-1:] in (["legend"], ["adds-up-warning"])
        ):
            self._in.pop()
        elif tag == "tr":
            self._cells = None

    def handle_data(self, data: str) -> None:
        self.page.text += data
        if self._cells:
            self._cells[-1] += data
        elif self._in[-1:] == ["legend"] and self.page.legend:
            kind, label = self.page.legend[-1]
            self.page.legend[-1] = (kind, label + data)
        elif self._in[-1:] == ["adds-up-warning"]:
            self.page.warning = (self.page.warning or "") + data


def read_why_page(html: str) -> WhyPage:
    reader = _Reader()
    reader.feed(html)
    page = reader.page
    page.rows = [(kind, [cell.strip() for cell in cells]) for kind, cells in page.rows]
    page.total = [cell.strip() for cell in page.total]
    page.legend = [(kind, label.strip()) for kind, label in page.legend]
    return page


def six_parts_over_shared_holds(timeline: Timeline) -> tuple[Job, str]:
    """Ann's chat job, submitted at 0 and started at 15, told in six parts of
    five kinds: bob's job already running (-3 to 4) shares 1 to 4 with one
    dispatched ahead (1 to 6, loading its model first), the GPU idle (6 to
    7, 9 to 10, 14 to 15), her own earlier attempt cut by an unload (7 to
    9), llama-swap refusing bob's next job (10 to 12) and that job run
    ahead (12 to 14). Returns her job and her token."""
    ModelSetting.objects.create(name="chat-small", parallel=4)
    # A learned swap of 1.5 s: a start that loads chat-small takes that first.
    RunStats.objects.create(
        model="chat-small",
        path="/v1/chat/completions",
        warm_seconds=2.0,
        warm_samples=1,
        cold_seconds=3.5,
        cold_samples=1,
    )
    ann, token = factories.member("ann", "free")
    bob, _ = factories.member("bob", "max")
    running, ahead, refused = (
        timeline.submitted(bob, -5 + n, priority="interactive") for n in range(3)
    )
    waiting = timeline.submitted(ann, 0, priority="batch")
    timeline.ran(running, -3, 4, slot=0, in_flight=1)
    timeline.ran(ahead, 1, 6, slot=1, in_flight=2, swap=True)
    timeline.returned(waiting, 7, 9)
    timeline.returned(refused, 10, 10.5, cut=False)
    timeline.ran(refused, 12, 14)
    timeline.ran(waiting, 15, 20)
    return waiting, token
