"""A submission's opening (its locks and what it reads first, in one round
trip: the submission is on the path of every REST and front-door call), its
place in its member's line, and its row (services/jobs.py `job_queue` runs
them in order)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from queueapp.durations import Durations
from queueapp.locks import MEMBER_LINES_LOCK
from queueapp.models import Gpu, Job, Member, Policy, RunStats, Tier
from queueapp.models.jobs import MAX_SIZE_TEXT
from queueapp.policy import PolicySettings, clamp_priority, rank_key
from queueapp.policy.expected import Expected
from queueapp.policy.request_size import RequestSize
from queueapp.policy.score import shortness
from queueapp.prepared import from_row, model_columns, prepared_cursor, select_list
from queueapp.selectors import MemberLine, member_line_state


@dataclass(frozen=True)
class SubmissionOpening:
    """What a submission reads first: the clock, the queue's state, and the
    member's tier, held FOR SHARE."""

    now: datetime  # the transaction's start, by the database's clock
    queue_open: bool
    aging_divisor: float
    # Shorter first inside a band (policy/score.py `shortness`).
    shortest_first_weight: float
    shortest_first_scale: float
    # The policy's default wait bound per band ({band: seconds}).
    max_wait_by_band: dict[str, float]
    # The policy's band by path, for a call that names none ({path: band}).
    priority_by_path: dict[str, int]
    tier: Tier
    # The models the enabled GPUs run, when a submission for another should
    # be refused: several GPUs, every one's list known. None: any model.
    models_served: frozenset[str] | None
    # What runs of the job's model took (its rows alone) and the operator's
    # typical_seconds for it: the job's expected run (Durations.expected).
    durations: Durations

    def expected_run(self, model: str, path: str, size: RequestSize | None) -> Expected:
        """The job's expected run, from its size (None: none read)."""
        if size is None:
            return self.durations.expected(model, path, None)
        return self.durations.expected(model, path, size.value, size.text)

    def shortness(self, expected_seconds: float | None) -> float:
        """The shortest-first term of a job expected to run so long."""
        settings = PolicySettings(
            shortest_first_weight=self.shortest_first_weight,
            shortest_first_scale=self.shortest_first_scale,
        )
        return shortness(expected_seconds, settings)


def submission_open(member_id: int, *, model: str) -> SubmissionOpening:
    """A submission's two locks, in the order of queueapp/locks.py, in one round trip: the
    member's tier read FOR SHARE (concurrent submissions share it, a tier
    change waits for them and they for it), then the member's lines lock.
    With the clock, the policy (its defaults until an operator saves one)
    and the models the GPUs run, and what the model's runs took.

    The tier is locked inside a materialized CTE, whose rows exist only once
    locked; the lines lock is taken as the outer query reads that row."""
    policy = Policy()
    with prepared_cursor() as cursor:
        cursor.execute(
            f"""
            WITH opening AS MATERIALIZED (
                SELECT now() AS opened_at,
                       coalesce(policy.queue_open, %(queue_open)s) AS queue_open,
                       coalesce(policy.aging_divisor, %(aging_divisor)s) AS aging_divisor,
                       coalesce(policy.shortest_first_weight, %(weight)s) AS weight,
                       coalesce(policy.shortest_first_scale, %(scale)s) AS scale,
                       coalesce(policy.max_wait_by_band, '{{}}') AS max_wait_by_band,
                       coalesce(policy.priority_by_path, %(priority_by_path)s::jsonb)
                           AS priority_by_path,
                       {select_list("tier", Tier)}
                  FROM queueapp_member AS member
                  JOIN queueapp_tier AS tier ON tier.id = member.tier_id
                  LEFT JOIN queueapp_policy AS policy ON policy.id = 1
                 WHERE member.id = %(member)s
                   FOR SHARE OF tier)
            SELECT opening.opened_at, opening.queue_open, opening.aging_divisor,
                   opening.weight, opening.scale,
                   opening.max_wait_by_band, opening.priority_by_path,
                   {select_list("opening", Tier)},
                   (SELECT coalesce(json_agg(json_build_array(gpu.served_models,
                                                             gpu.allowed_models)), '[]')
                      FROM queueapp_gpu AS gpu WHERE gpu.enabled) AS gpu_lists,
                   (SELECT coalesce(json_agg(stats), '[]') FROM queueapp_runstats AS stats
                     WHERE stats.model = %(model)s AND stats.concurrency = 1) AS model_runs,
                   (SELECT setting.typical_seconds FROM queueapp_modelsetting AS setting
                     WHERE setting.name = %(model)s) AS typical_seconds,
                   pg_advisory_xact_lock(%(lines)s, %(member)s) AS lines_locked
              FROM opening
            """,
            {
                "queue_open": policy.queue_open,
                "aging_divisor": policy.aging_divisor,
                "weight": policy.shortest_first_weight,
                "scale": policy.shortest_first_scale,
                "priority_by_path": json.dumps(policy.priority_by_path),
                "member": member_id,
                "lines": MEMBER_LINES_LOCK,
                "model": model,
            },
        )
        row = cursor.fetchone()
        names = [column.name for column in cursor.description]
    # By name, not position: a column dropped or renamed fails here at once,
    # and one added cannot shift the others.
    opening = dict(zip(names, row, strict=True))
    return SubmissionOpening(
        now=opening["opened_at"],
        queue_open=opening["queue_open"],
        aging_divisor=opening["aging_divisor"],
        shortest_first_weight=opening["weight"],
        shortest_first_scale=opening["scale"],
        max_wait_by_band=_json(opening["max_wait_by_band"]),
        priority_by_path=_json(opening["priority_by_path"]),
        tier=from_row(Tier, [opening[column] for column in model_columns(Tier)]),
        models_served=_models_served(opening["gpu_lists"]),
        durations=Durations(
            [RunStats(**row) for row in _json(opening["model_runs"])],
            {} if opening["typical_seconds"] is None else {model: opening["typical_seconds"]},
        ),
    )


def _json(value: Any) -> Any:
    """A jsonb column of a raw row: Django leaves it undecoded."""
    return json.loads(value) if isinstance(value, str) else value


def _models_served(gpu_lists: list[list[list[str] | None]]) -> frozenset[str] | None:
    """`Gpu.models_served` of the enabled GPUs' lists (served, allowed)."""
    return Gpu.models_served(
        [Gpu(served_models=served, allowed_models=allowed or []) for served, allowed in gpu_lists]
    )


@dataclass(frozen=True)
class LinePlace:
    """Where a new job queues: the member's tier as read under the lines
    lock, the band asked for and the one it clamps to, and that band's line."""

    tier: Tier
    requested: int
    applied: int
    line: MemberLine


def place_in_line(
    opening: SubmissionOpening, *, member_id: int, requested: int, model: str
) -> LinePlace:
    """The band clamped to the member's tier, and that band's line, read
    under the lines lock. The tier read with the lock is the one that
    counts: a member moved to another tier meanwhile is clamped again."""
    tier = opening.tier
    applied = clamp_priority(requested, floor=tier.priority_floor, cap=tier.priority_cap)
    line = member_line_state(member_id, band=applied, model=model)
    if line.tier_id != tier.pk:  # moved to another tier meanwhile
        tier = Tier.objects.get(pk=line.tier_id)
        applied = clamp_priority(requested, floor=tier.priority_floor, cap=tier.priority_cap)
        line = member_line_state(member_id, band=applied, model=model)
    return LinePlace(tier=tier, requested=requested, applied=applied, line=line)


def job_row_insert(
    *,
    member: Member,
    place: LinePlace,
    opening: SubmissionOpening,
    path: str,
    body: dict[str, Any],
    model: str,
    callback_url: str,
    chain: dict[str, Any],
    front_door: bool,
    gateway: int | None,
    wait_deadline: datetime | None,
    pinned_gpu: str,
    expected: Expected,
) -> Job:
    """The job's row, submitted and eligible at the transaction's start, or
    with the line's latest job if that is later: a submission that waited
    for the lines lock behind one begun after it (on a busy machine) comes
    after the job it waited for, which heads the line already."""
    latest = place.line.latest_submitted_at
    now = opening.now if latest is None else max(opening.now, latest)
    short = opening.shortness(expected.p50)
    return Job.objects.create(
        member=member,
        path=path,
        body=body,
        model=model,
        priority_requested=place.requested,
        priority=place.applied,
        submitted_at=now,
        eligible_at=now,
        rank_key=rank_key(
            band=place.applied,
            tier_bonus=place.tier.bonus,
            eligible_at=now.timestamp(),
            aging_divisor=opening.aging_divisor,
            shortness=short,
        ),
        # Last in its queue line, so its head only if the line was empty.
        is_lane_head=place.line.is_empty,
        callback_url=callback_url,
        front_door=front_door,
        gateway=gateway,
        chain_id=chain.get("id", ""),
        chain_index=chain.get("index"),
        chain_total=chain.get("total"),
        wait_deadline=wait_deadline,
        pinned_gpu=pinned_gpu,
        size=expected.size,
        size_text=expected.size_text[:MAX_SIZE_TEXT],
        expected_p50=expected.p50,
        expected_p90=expected.p90,
        expected_basis=expected.basis.value,
        shortness=short,
    )
