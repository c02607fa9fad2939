"""The queue as a viewer sees it: built once, then redacted per viewer.

`GET /api/queue/` and the live dashboard (`/ws/queue/`) show the same state.
`queue_state()` builds the full picture (names included) once per change;
`state_for()` cuts it down for one viewer: members see other members' jobs
without name, path or chain; staff see everything.

The live view (`live_state_for()`) lists only the head of the queue and the
viewer's own jobs placed further back: every change sends the queued list
again to every viewer (docs/benchmarks.md, "WebSocket fan-out"), so its size
must not grow with the queue. The rest is read a page at a time
(`queue_page()`: `GET /api/queue/?offset=&limit=`, or a `queue_page` message
on the WebSocket).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db.models import Count, Q

from queueapp.chain_summaries import chain_summaries
from queueapp.errors import InvalidInput
from queueapp.eta import queue_forecast
from queueapp.models import DispatchDecision, Job, JobStatus, Member
from queueapp.policy import Forecast
from queueapp.queue_forecast import QueueForecast
from queueapp.rendering import decision_entry, gpu_entry, queue_entry
from queueapp.selectors import (
    RunningJob,
    band_stats,
    gpus_list,
    model_parallels,
    running_jobs,
)

# Queued jobs the state places in dispatch order: GET /api/queue/'s default page.
QUEUE_VIEW_LIMIT = 200
# The live view lists the first jobs of the queue, and the viewer's own among
# the placed ones further back, at most this many.
LIVE_QUEUE_HEAD = 50
LIVE_OWN_FURTHER = 20
# Members listed with their counts, most queued first (the viewer's own always).
MEMBERS_SHOWN = 10
# How deep a page may reach: each page plays the queue forward to its end.
QUEUE_PAGE_DEPTH = 2000
RECENT_DECISIONS = 10


@dataclass(frozen=True)
class QueuePage:
    """Queued jobs at dispatch positions offset + 1 to offset + limit."""

    offset: int = 0
    limit: int = QUEUE_VIEW_LIMIT

    @classmethod
    def parse(cls, *, offset: object, limit: object) -> QueuePage:
        """From a query string or a WebSocket message (None: the default). A
        page that would pass QUEUE_PAGE_DEPTH ends there."""
        start = _whole_number(offset, field="offset", default=0)
        length = _whole_number(limit, field="limit", default=QUEUE_VIEW_LIMIT)
        if start >= QUEUE_PAGE_DEPTH:
            raise InvalidInput(
                f"must be below {QUEUE_PAGE_DEPTH}: the forecast places no job further back",
                field="offset",
            )
        if not 1 <= length <= QUEUE_VIEW_LIMIT:
            raise InvalidInput(f"must be 1 to {QUEUE_VIEW_LIMIT}", field="limit")
        return cls(offset=start, limit=min(length, QUEUE_PAGE_DEPTH - start))


def _whole_number(value: object, *, field: str, default: int) -> int:
    if value is None:
        return default
    if isinstance(value, str) and value.isascii() and value.isdecimal():
        # Past any bound either way; and int() refuses thousands of digits.
        if len(value) > 9:
            raise InvalidInput("too large", field=field)
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise InvalidInput("must be a whole number (0, 1, 2, …)", field=field)


def _queued_entries(forecast: QueueForecast, places: list[Forecast]) -> list[dict[str, Any]]:
    jobs = (
        Job.objects.select_related("member__tier")
        .defer("body")
        .in_bulk([place.job_id for place in places])
    )
    return [
        {
            **queue_entry(
                jobs[place.job_id],
                terms=forecast.terms_now(place.job_id),
                position=place.position,
            ),
            "estimated_start_at": forecast.start_of(place).isoformat(),
            # The start rests on a run of which nothing is known (eta.is_guess).
            "estimate_is_guess": forecast.is_guess(place),
            # Where the forecast expects it to run (several GPUs).
            "expected_gpu": place.gpu or None,
        }
        for place in places
        if place.job_id in jobs
    ]


def queue_page(page: QueuePage) -> dict[str, Any]:
    """One page of the queue, names included (redact with `page_for`)."""
    forecast = queue_forecast(horizon=page.offset + page.limit)
    places = forecast.order[page.offset : page.offset + page.limit]
    return {
        "as_of": forecast.now.isoformat(),
        "offset": page.offset,
        "limit": page.limit,
        "queued": _queued_entries(forecast, places),
    }


def member_counts() -> list[dict[str, Any]]:
    """Queued and running jobs per member, most queued first."""
    rows = (
        Job.objects.filter(status__in=[JobStatus.QUEUED, JobStatus.RUNNING])
        .values("member_id", "member__name")
        .annotate(
            queued=Count("id", filter=Q(status=JobStatus.QUEUED)),
            running=Count("id", filter=Q(status=JobStatus.RUNNING)),
        )
        # Ties by id, not name: the order must not hint at a hidden name.
        .order_by("-queued", "-running", "member_id")
    )
    return [
        {
            "member_id": row["member_id"],
            "member": row["member__name"],
            "queued": row["queued"],
            "running": row["running"],
        }
        for row in rows
    ]


def queue_state(page: QueuePage = QueuePage()) -> dict[str, Any]:
    """Everything the queue view shows, with names (never sent as is);
    `queued` holds `page` of the queue."""
    forecast = queue_forecast(horizon=max(QUEUE_VIEW_LIMIT, page.offset + page.limit))
    running_entries = []
    for running in running_jobs():
        entry = queue_entry(running, terms=running.score_at_dispatch or {}, position=None)
        end = forecast.expected_end_of(running.pk)
        entry["estimated_end_at"] = (end or forecast.gpu_free_at).isoformat()
        # Reported by the holder watchdog (queueapp/services/running_long.py).
        entry["running_long"] = running.running_long_at is not None
        running_entries.append(entry)
    gpus = gpus_list()
    running_on: dict[str, list[RunningJob]] = {}
    for entry in running_entries:
        running_on.setdefault(entry["gpu"], []).append(RunningJob(entry["id"], entry["model"]))
    parallel = model_parallels()
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
    checked = [gpu for gpu in gpus if gpu.checked_at is not None]
    last_checked = max((gpu.checked_at for gpu in checked if gpu.checked_at), default=None)
    members = member_counts()
    return {
        "as_of": forecast.now.isoformat(),
        "resident_model": forecast.resident_model,
        "dispatch_paused": forecast.paused,
        # Every GPU at once: reachable when all are (the `gpus` say which is not).
        "upstream": {
            "reachable": all(gpu.reachable for gpu in checked) if checked else None,
            "checked_at": last_checked.isoformat() if last_checked else None,
            "error": "; ".join(f"{gpu.name}: {gpu.error}" for gpu in checked if gpu.error) or None,
        },
        # GPU URLs are for staff (GET /api/gpus/): never in the shared state.
        "gpus": [
            gpu_entry(gpu, running=running_on.get(gpu.name, []), parallel=parallel, staff=False)
            for gpu in gpus
        ],
        "running": running_entries[0] if running_entries else None,
        "running_all": running_entries,
        "queued": _queued_entries(forecast, forecast.order[page.offset : page.offset + page.limit]),
        "queued_total": sum(band["queued"] for band in bands),
        "bands": bands,
        "members": members,
        "members_total": len(members),
        "recent_decisions": [decision_entry(decision) for decision in decisions],
        "chains": chains,
    }


def _redact(item: dict[str, Any], viewer: Member | None, *private: str) -> None:
    """Another member's item loses its owner's name (and `private` fields),
    unless the viewer is staff; `mine` says whose it is."""
    owner = item.pop("member_id", None)
    item["mine"] = viewer is not None and owner == viewer.pk
    if not (item["mine"] or (viewer is not None and viewer.is_staff)):
        item["member"] = None
        for key in private:
            item[key] = None


def state_for(
    state: dict[str, Any], viewer: Member | None, *, queued: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """A copy of `state` for one viewer (None: the public, anonymous view),
    listing `queued` (a selection of the state's) instead of all it has."""
    # Shallow copies: redaction replaces values, never edits nested ones, and
    # this runs once per viewer audience on every change (docs/benchmarks.md).
    view = dict(state)
    view["running"] = dict(state["running"]) if state["running"] else None
    for key in ("recent_decisions", "chains", "running_all"):
        view[key] = [dict(item) for item in state[key]]
    view["queued"] = [dict(item) for item in (state["queued"] if queued is None else queued)]
    me = viewer.pk if viewer is not None else None
    view["members"] = [
        dict(row)
        for index, row in enumerate(state["members"])
        if index < MEMBERS_SHOWN or row["member_id"] == me
    ]
    for entry in [view["running"], *view["running_all"], *view["queued"]]:
        if entry is not None:
            _redact(entry, viewer, "path", "chain")
    for item in [*view["recent_decisions"], *view["members"]]:
        _redact(item, viewer)
    for chain in view["chains"]:
        _redact(chain, viewer, "id")
    if not (viewer is not None and viewer.is_staff):
        view["chains"] = [chain for chain in view["chains"] if chain["mine"]]
    return view


def live_state_for(state: dict[str, Any], viewer: Member | None) -> dict[str, Any]:
    """The live dashboard's view: the first LIVE_QUEUE_HEAD queued jobs, then
    the viewer's own among those placed further back (at most
    LIVE_OWN_FURTHER); however long the queue, a message stays this size."""
    head = state["queued"][:LIVE_QUEUE_HEAD]
    own_further = [
        entry
        for entry in state["queued"][LIVE_QUEUE_HEAD:]
        if viewer is not None and entry["member_id"] == viewer.pk
    ][:LIVE_OWN_FURTHER]
    # How many of `queued` are the head: the rest are the viewer's own.
    return {**state_for(state, viewer, queued=head + own_further), "queued_head": len(head)}


def page_for(page: dict[str, Any], viewer: Member | None) -> dict[str, Any]:
    """A `queue_page()` as `viewer` may see it."""
    entries = [dict(entry) for entry in page["queued"]]
    for entry in entries:
        _redact(entry, viewer, "path", "chain")
    return {**page, "queued": entries}
