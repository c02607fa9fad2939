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
from queueapp.rendering import decision_entry, gpu_entry, queue_entry
from queueapp.selectors import band_stats, gpus_list, running_jobs

# Queued jobs listed (and played forward).
QUEUE_VIEW_LIMIT = 200
RECENT_DECISIONS = 10


def queue_state() -> dict[str, Any]:
    """Everything the queue view shows, with names (never sent as is)."""
    forecast = queue_forecast(horizon=QUEUE_VIEW_LIMIT)
    running_entries = []
    for running in running_jobs():
        entry = queue_entry(running, terms=running.score_at_dispatch or {}, position=None)
        end = forecast.gpu_free_at_for(running.gpu.name) if running.gpu else None
        entry["estimated_end_at"] = (end or forecast.gpu_free_at).isoformat()
        running_entries.append(entry)
    gpus = gpus_list()
    running_on = {entry["gpu"]: entry["id"] for entry in running_entries}
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
    decisions = DispatchDecision.objects.select_related("job__member", "gpu").order_by("-id")[
        :RECENT_DECISIONS
    ]
    checked = [gpu for gpu in gpus if gpu.checked_at]
    return {
        "as_of": forecast.now.isoformat(),
        "resident_model": forecast.resident_model,
        "dispatch_paused": forecast.paused,
        # Every GPU at once: reachable when all are (the `gpus` say which is not).
        "upstream": {
            "reachable": all(gpu.reachable for gpu in checked) if checked else None,
            "checked_at": max(gpu.checked_at for gpu in checked).isoformat() if checked else None,
            "error": "; ".join(f"{gpu.name}: {gpu.error}" for gpu in checked if gpu.error) or None,
        },
        # GPU URLs are for staff (GET /api/gpus/): never in the shared state.
        "gpus": [
            gpu_entry(gpu, running_job_id=running_on.get(gpu.name), staff=False) for gpu in gpus
        ],
        "running": running_entries[0] if running_entries else None,
        "running_all": running_entries,
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
    for key in ("queued", "recent_decisions", "chains", "running_all"):
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

    for entry in [view["running"], *view["running_all"], *view["queued"]]:
        if entry is not None:
            redact(entry, "path", "chain")
    for decision in view["recent_decisions"]:
        redact(decision)
    for chain in view["chains"]:
        redact(chain, "id")
    if not staff:
        view["chains"] = [chain for chain in view["chains"] if chain["mine"]]
    return view
