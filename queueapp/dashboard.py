"""The queue as a viewer sees it: built once, then redacted per viewer.

`GET /api/queue/` and the live dashboard (`/ws/queue/`) show the same state.
`queue_state()` builds the full picture (names included) once per change;
`state_for()` cuts it down for one viewer: members see other members' jobs
without name, path or chain; staff see everything.
"""

from __future__ import annotations

from typing import Any

from queueapp.chains import chain_summaries
from queueapp.eta import queue_forecast
from queueapp.models import DispatchDecision, Job, JobStatus, Member
from queueapp.rendering import decision_entry, queue_entry
from queueapp.selectors import band_stats, running_job, upstream_state_get

# Queued jobs listed (and played forward).
QUEUE_VIEW_LIMIT = 200
RECENT_DECISIONS = 10


def queue_state() -> dict[str, Any]:
    """Everything the queue view shows, with names (never sent as is)."""
    forecast = queue_forecast(horizon=QUEUE_VIEW_LIMIT)
    running = running_job()
    running_entry = None
    if running is not None:
        running_entry = queue_entry(running, terms=running.score_at_dispatch or {}, position=None)
        running_entry["estimated_end_at"] = forecast.gpu_free_at.isoformat()
    upstream = upstream_state_get()
    bands = band_stats(window="hour")
    chain_owners = (
        Job.objects.filter(status__in=[JobStatus.QUEUED, JobStatus.RUNNING])
        .exclude(chain_id="")
        .values_list("member_id", flat=True)
        .distinct()
    )
    chains = [
        {**chain, "member_id": owner.pk, "member": owner.name}
        for owner in Member.objects.filter(pk__in=list(chain_owners))
        for chain in chain_summaries(member=owner)
        if chain["queued"] or chain["running"]
    ]
    decisions = DispatchDecision.objects.select_related("job__member").order_by("-id")[
        :RECENT_DECISIONS
    ]
    return {
        "as_of": forecast.now.isoformat(),
        "resident_model": forecast.resident_model,
        "dispatch_paused": forecast.paused,
        "upstream": {
            "reachable": upstream.reachable if upstream.checked_at else None,
            "checked_at": upstream.checked_at.isoformat() if upstream.checked_at else None,
            "error": upstream.error or None,
        },
        "running": running_entry,
        "queued": [
            {
                **queue_entry(
                    forecast.jobs[place.job_id],
                    terms=forecast.terms_now(place.job_id),
                    position=place.position,
                ),
                "estimated_start_at": forecast.start_of(place).isoformat(),
            }
            for place in forecast.order
        ],
        "queued_total": sum(band["queued"] for band in bands),
        "bands": bands,
        "recent_decisions": [decision_entry(decision) for decision in decisions],
        "chains": chains,
    }


def state_for(state: dict[str, Any], viewer: Member | None) -> dict[str, Any]:
    """A copy of `state` for one viewer (None: the public, anonymous view)."""
    # Shallow copies: redaction replaces values, never edits nested ones, and
    # this runs once per viewer audience on every change (docs/benchmarks.md).
    view = dict(state)
    view["running"] = dict(state["running"]) if state["running"] else None
    for key in ("queued", "recent_decisions", "chains"):
        view[key] = [dict(item) for item in state[key]]
    staff = viewer is not None and viewer.is_staff
    me = viewer.pk if viewer is not None else None

    def redact(item: dict[str, Any], *private: str) -> None:
        owner = item.pop("member_id", None)
        item["mine"] = owner is not None and owner == me
        if not (staff or item["mine"]):
            item["member"] = None
            for key in private:
                item[key] = None

    for entry in [view["running"], *view["queued"]]:
        if entry is not None:
            redact(entry, "path", "chain")
    for decision in view["recent_decisions"]:
        redact(decision)
    for chain in view["chains"]:
        redact(chain, "id")
    if not staff:
        view["chains"] = [chain for chain in view["chains"] if chain["mine"]]
    return view
