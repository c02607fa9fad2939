"""Server-rendered pages. Members log in with their API token (kept in the
session); staff may also use their admin session."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib.auth import logout
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from queueapp.errors import NotFound
from queueapp.logins import TooManyFailedLogins, client_address, member_login
from queueapp.models import Member
from queueapp.selectors import job_get_for_member, policy_get, viewer_from_session
from queueapp.why import job_why

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
    """The explanation of a wait: a timeline to scale and the terms side by side."""
    viewer = page_viewer(request)
    if viewer is None:
        return redirect(f"/login/?next={request.path}")
    try:
        job = job_get_for_member(job_id=job_id, member=viewer)
    except NotFound:
        return render(request, "not_found.html", {"what": f"job {job_id}"}, status=404)
    answer = job_why(job=job, viewer=viewer)
    return render(
        request,
        "why.html",
        {"job": job, "why": answer, "timeline": timeline(answer), "viewer": viewer},
    )


PART_COLOURS = {
    "running_when_submitted": "#8a8f98",
    "gpu_idle": "#d9dce1",
    "band": "#c2410c",
    "aging": "#7c3aed",
    "fairness": "#0f766e",
    "tier_bonus": "#b45309",
    "swap_affinity": "#1d4ed8",
    "shortness": "#0369a1",
    "submission order": "#475569",
    "your earlier job": "#64748b",
    "swap": "#facc15",
    "upstream_unavailable": "#dc2626",
    "dispatcher_unavailable": "#991b1b",
    "running_limit": "#0891b2",
    "drain": "#be185d",
    "own_run": "#16a34a",
}


def timeline(answer: dict[str, Any]) -> dict[str, Any]:
    """Bars and markers in percent of the job's life (submission to its
    finish, or to now), so the template draws them to scale: the parts of the
    wait, then the job's own run."""
    start = datetime.fromisoformat(answer["submitted_at"])
    end = answer["finished_at"] or (answer["started_at"] and answer["as_of"]) or None
    life = (datetime.fromisoformat(end) - start).total_seconds() if end else 0.0
    total = max(answer["measured_wait_seconds"], life, 1e-6)

    def at(moment: str) -> float:
        return round(100 * (datetime.fromisoformat(moment) - start).total_seconds() / total, 3)

    bars = []
    for part in answer["parts"]:
        spans = part.get("intervals") or [{"from": part.get("from"), "to": part.get("to")}]
        colour = PART_COLOURS.get(part.get("deciding_term") or part["kind"], "#94a3b8")
        for span in spans:
            if not span["from"]:
                continue
            left, right = at(span["from"]), at(span["to"])
            swap = part.get("swap_seconds") or 0.0
            swap_width = round(100 * swap / total, 3)
            bars.append(
                {
                    "left": left,
                    "width": max(0.2, right - left),
                    "swap_width": swap_width,
                    "colour": colour,
                    "kind": part["kind"],
                    "label": part.get("reason", ""),
                    "job": part.get("job"),
                    "seconds": part["seconds"] + swap,
                    "text": _bar_text(part),
                }
            )
    markers = [{"at": 0.0, "label": "submitted"}]
    if answer["started_at"]:
        started = at(answer["started_at"])
        run_end = answer["finished_at"] or answer["as_of"]
        bars.append(
            {
                "left": started,
                "width": max(0.2, at(run_end) - started),
                "swap_width": 0,
                "colour": PART_COLOURS["own_run"],
                "kind": "own_run",
                "label": "this job running" if not answer["finished_at"] else "this job's run",
                "job": None,
                "seconds": (
                    datetime.fromisoformat(run_end) - datetime.fromisoformat(answer["started_at"])
                ).total_seconds(),
                "text": "",
            }
        )
        markers.append({"at": started, "label": "started"})
        markers.append({"at": 100.0, "label": "finished" if answer["finished_at"] else "now"})
    else:
        markers.append({"at": 100.0, "label": "now"})
    legend = [
        {"colour": PART_COLOURS[key], "label": label}
        for key, label in LEGEND
        if any(bar["colour"] == PART_COLOURS[key] for bar in bars)
        or (key == "swap" and any(bar["swap_width"] for bar in bars))
    ]
    return {"bars": bars, "markers": markers, "total_seconds": total, "legend": legend}


LEGEND = [
    ("running_when_submitted", "already running"),
    ("band", "higher band"),
    ("aging", "waited longer"),
    ("fairness", "other member's turn"),
    ("tier_bonus", "higher tier"),
    ("swap_affinity", "model already loaded"),
    ("your earlier job", "your earlier job"),
    ("submission order", "submitted earlier"),
    ("swap", "model swap"),
    ("upstream_unavailable", "llama-swap unavailable"),
    ("dispatcher_unavailable", "dispatcher stopped"),
    ("running_limit", "your own job running"),
    ("drain", "requests in flight ending before a swap"),
    ("gpu_idle", "GPU idle"),
    ("own_run", "this job running"),
]


def _bar_text(part: dict[str, Any]) -> str:
    job = part.get("job")
    if not job:
        return ""
    band = f"{job['band']:+d}" if job["band"] else "0"
    return f"#{job['id']} {band}"
