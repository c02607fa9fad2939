"""Server-rendered pages. Members log in with their API token (kept in the
session); staff may also use their admin session."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.contrib.auth import logout
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from queueapp.errors import InvalidInput, NotFound
from queueapp.logins import TooManyFailedLogins, client_address, member_login
from queueapp.models import Member
from queueapp.selectors import (
    job_get_for_member,
    job_why_as_of,
    policy_get,
    viewer_from_session,
)
from queueapp.why import PartKind, job_why

SESSION_MEMBER = "gpusched_member_id"


def page_viewer(request: HttpRequest) -> Member | None:
    """The member looking at a page, or None (then the page asks for a token)."""
    return viewer_from_session(
        member_id=request.session.get(SESSION_MEMBER), user=getattr(request, "user", None)
    )


def home(request: HttpRequest) -> HttpResponse:
    """The live dashboard for viewers; the front page with links for others."""
    viewer = page_viewer(request)
    if viewer is not None or policy_get().public_dashboard:
        return render(request, "dashboard.html", {"viewer": viewer})
    return render(request, "home.html", {"viewer": viewer})


@require_http_methods(["GET", "POST"])
def login_page(request: HttpRequest) -> HttpResponse:
    error = ""
    next_url = request.POST.get("next") or request.GET.get("next") or "/"
    if not next_url.startswith("/") or next_url.startswith("//"):
        next_url = "/"  # only local redirects
    status = 200
    if request.method == "POST":
        try:
            member = member_login(
                token=request.POST.get("token", ""), client=client_address(request.META)
            )
        except TooManyFailedLogins as exc:
            response = render(
                request, "login.html", {"error": exc.message, "next": next_url}, status=429
            )
            response["Retry-After"] = str(exc.retry_after)
            return response
        if member is not None:
            request.session.cycle_key()
            request.session[SESSION_MEMBER] = member.pk
            return redirect(next_url)
        error, status = "That token matches no member.", 401
    return render(request, "login.html", {"error": error, "next": next_url}, status=status)


@require_http_methods(["POST"])
def logout_page(request: HttpRequest) -> HttpResponse:
    request.session.pop(SESSION_MEMBER, None)
    logout(request)
    return redirect("/")


def job_why_page(request: HttpRequest, job_id: int) -> HttpResponse:
    """The explanation of a wait: a timeline to scale and the terms side by
    side; `?as_of=` tells a queued job's wait at that instant, as the API does."""
    viewer = page_viewer(request)
    if viewer is None:
        return redirect(f"/login/?next={request.path}")
    try:
        job = job_get_for_member(job_id=job_id, member=viewer)
    except NotFound:
        return render(request, "not_found.html", {"what": f"job {job_id}"}, status=404)
    try:
        as_of = job_why_as_of(job=job, raw=request.GET.get("as_of"))
    except InvalidInput as exc:
        return render(
            request, "bad_request.html", {"message": f"{exc.field}: {exc.message}"}, status=400
        )
    answer = job_why(job=job, viewer=viewer, as_of=as_of)
    return render(
        request,
        "why.html",
        {
            "job": job,
            "why": answer,
            "timeline": timeline(answer, as_of_asked=as_of is not None),
            "rows": part_rows(answer),
            "as_of_asked": as_of is not None,
            "viewer": viewer,
        },
    )


# One colour per kind of part, and for the swap drawn over the start of a
# job dispatched ahead and the job's own run.
PART_COLOURS = {
    PartKind.RUNNING_WHEN_SUBMITTED: "#8a8f98",
    PartKind.DISPATCHED_AHEAD: "#c2410c",
    PartKind.OWN_EARLIER_ATTEMPT: "#65a30d",
    PartKind.UPSTREAM_UNAVAILABLE: "#dc2626",
    PartKind.DISPATCHER_UNAVAILABLE: "#991b1b",
    PartKind.DRAIN: "#be185d",
    PartKind.RUNNING_LIMIT: "#0891b2",
    PartKind.GPU_IDLE: "#d9dce1",
    "swap": "#facc15",
    "own_run": "#16a34a",
}

# What each colour stands for, in the legend's order; the parts table names
# the kinds with the same words.
LEGEND = [
    (PartKind.RUNNING_WHEN_SUBMITTED, "already running"),
    (PartKind.DISPATCHED_AHEAD, "dispatched ahead"),
    ("swap", "model swap"),
    (PartKind.OWN_EARLIER_ATTEMPT, "your own earlier attempt"),
    (PartKind.UPSTREAM_UNAVAILABLE, "llama-swap unavailable"),
    (PartKind.DISPATCHER_UNAVAILABLE, "dispatcher stopped"),
    (PartKind.DRAIN, "in flight, draining for a swap"),
    (PartKind.RUNNING_LIMIT, "your own job running"),
    (PartKind.GPU_IDLE, "GPU idle"),
    ("own_run", "this job running"),
]
KIND_LABELS = dict(LEGEND)


def timeline(answer: dict[str, Any], *, as_of_asked: bool = False) -> dict[str, Any]:
    """Bars and markers in percent of the job's life (submission to its
    finish, or to now), so the template draws them to scale: the wait as
    its pieces, then the job's own run.

    Each piece of the wait (`answer["pieces"]`, which tile it) is drawn as
    as many equal bars side by side as the parts that shared it, each in
    its part's colour, so every part's bars add up to its seconds and
    overlapping runs hide none. The bars' edges are rounded, not their
    widths, so the widths add up to the wait's share of the drawing. A
    queued job's wait told at an `as_of` asked for ends there, not now."""
    start = datetime.fromisoformat(answer["submitted_at"])
    end = answer["finished_at"] or (answer["started_at"] and answer["as_of"]) or None
    life = (datetime.fromisoformat(end) - start).total_seconds() if end else 0.0
    total = max(answer["measured_wait_seconds"], life, 1e-6)

    def percent(seconds: float) -> float:
        return round(100 * seconds / total, 4)

    def at(moment: str) -> float:
        return percent((datetime.fromisoformat(moment) - start).total_seconds())

    bars = _wait_bars(answer, start, percent)
    markers = [{"at": 0.0, "label": "submitted"}]
    if answer["started_at"]:
        started = at(answer["started_at"])
        bars.append(_own_run_bar(answer, started, at))
        markers.append({"at": started, "label": "started"})
        markers.append({"at": 100.0, "label": "finished" if answer["finished_at"] else "now"})
    else:
        markers.append({"at": 100.0, "label": "as of" if as_of_asked else "now"})
    drawn = {bar["kind"] for bar in bars} | (
        {"swap"} if any(b["swap_width"] for b in bars) else set()
    )
    legend = [
        {"kind": kind, "colour": PART_COLOURS[kind], "label": label}
        for kind, label in LEGEND
        if kind in drawn
    ]
    return {
        "bars": bars,
        "markers": markers,
        "total_seconds": total,
        "legend": legend,
        "swap_colour": PART_COLOURS["swap"],
    }


def _wait_bars(
    answer: dict[str, Any], start: datetime, percent: Callable[[float], float]
) -> list[dict[str, Any]]:
    """The wait's bars: each piece as equal bars side by side, one per part
    that shared it, the swaps drawn over their parts' first bars, and a mark
    where another part's bars begin (a line between them, and its label)."""
    parts = answer["parts"]
    bars = []
    for piece in answer["pieces"]:
        begin = (datetime.fromisoformat(piece["from"]) - start).total_seconds()
        length = (datetime.fromisoformat(piece["to"]) - start).total_seconds() - begin
        sharing = piece["parts"]
        for place, index in enumerate(sharing):
            left = percent(begin + length * place / len(sharing))
            right = percent(begin + length * (place + 1) / len(sharing))
            bars.append(_part_bar(parts[index], index, left, right))
    _swaps_drawn(bars, parts, percent)
    for before, bar in zip([None, *bars], bars, strict=False):
        bar["starts_part"] = before is None or before["part"] != bar["part"]
    return bars


def _own_run_bar(
    answer: dict[str, Any], started: float, at: Callable[[str], float]
) -> dict[str, Any]:
    """The job's own run, from its start to its finish (or to now)."""
    run_end = answer["finished_at"] or answer["as_of"]
    return {
        **_drawn(started, max(0.2, at(run_end) - started)),
        "part": None,
        "starts_part": True,
        "colour": PART_COLOURS["own_run"],
        "kind": "own_run",
        "label": "this job running" if not answer["finished_at"] else "this job's run",
        "job": None,
        "seconds": (
            datetime.fromisoformat(run_end) - datetime.fromisoformat(answer["started_at"])
        ).total_seconds(),
        "text": "",
    }


def _part_bar(part: dict[str, Any], index: int, left: float, right: float) -> dict[str, Any]:
    """One part's bar over `left` to `right` (percent), its share of a piece."""
    return {
        **_drawn(left, round(right - left, 4)),
        "part": index,
        "colour": PART_COLOURS.get(part["kind"], "#94a3b8"),
        "kind": part["kind"],
        "label": part.get("reason", ""),
        "job": part.get("job"),
        "seconds": part["shown_seconds"],
        "text": _bar_text(part),
    }


def _drawn(left: float, width: float, swap_width: float = 0.0) -> dict[str, Any]:
    """A bar's place in percent, and in the drawing's units (0 to 1000) as
    the SVG takes them, written out so no locale changes them."""
    return {
        "left": left,
        "width": width,
        "swap_width": swap_width,
        "x": f"{left * 10:.3f}",
        "w": f"{width * 10:.3f}",
        "swap_w": f"{swap_width * 10:.3f}",
    }


def _swaps_drawn(
    bars: list[dict[str, Any]], parts: list[dict[str, Any]], percent: Callable[[float], float]
) -> None:
    """The swap of each job dispatched ahead drawn over the start of its
    bars (it loaded its model first), filling them in order."""
    left_to_draw = {
        index: percent(part["swap_seconds"])
        for index, part in enumerate(parts)
        if part.get("swap_seconds")
    }
    for bar in bars:
        owed = left_to_draw.get(bar["part"], 0.0)
        if owed > 0:
            swap = min(owed, bar["width"])
            left_to_draw[bar["part"]] = owed - swap
            bar.update(_drawn(bar["left"], bar["width"], swap))


def part_rows(answer: dict[str, Any]) -> list[dict[str, Any]]:
    """The parts table's rows: each part with its kind in words."""
    return [
        {"part": part, "label": KIND_LABELS.get(part["kind"], part["kind"])}
        for part in answer["parts"]
    ]


def _bar_text(part: dict[str, Any]) -> str:
    job = part.get("job")
    if not job:
        return ""
    band = f"{job['band']:+d}" if job["band"] else "0"
    return f"#{job['id']} {band}"
