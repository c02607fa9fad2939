"""Why the heads a claim passed over did not start, as data kept with it.

Kueue writes each entry's reason onto the entry as it skips it
(`pkg/scheduler/scheduler.go`, `nominate` and `requeueAndUpdate`); here the
claim keeps them with what it wrote: the decision row of a start
(`DispatchDecision.skips`) and, for a pass that starts nothing on an idle
GPU, the GPU's one idle record (`GpuIdle`, the latest, not a row per pass),
which the start ending the idle stretch moves into its decision
(`DispatchDecision.idle_reason`). `why` reads them (queueapp/why/) instead
of rebuilding the running limit from history.

The record, as JSON:

- `skipped`: `decide`'s skips, heads per reason (decide.Skip);
- `left_out`: what the pre-filter (decide.prefilter) left out before the
  heads were read: `running_limit`, how many members were at their limit;
  `not_served` and `reserved`, whether it left out the models the GPU does
  not run and what its reservation keeps out;
- `capped_members`: the members at their running limit on this GPU (left
  out by the pre-filter, or skipped by `decide`), at most
  `MAX_CAPPED_MEMBERS` of them, and `holding`: per such member, its limit
  and its running jobs (id and GPU) that held it.

Plain Python: the claim builds it from what it read, `why` reads it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from queueapp.policy.decide import Decision, HeadFilter, Skip

# Members named in one record; a member past them is told from history.
MAX_CAPPED_MEMBERS = 50


@dataclass(frozen=True)
class Holding:
    """A member with running jobs: its running limit, and those jobs (id
    and GPU name)."""

    member_id: int
    limit: int
    jobs: Sequence[tuple[int, str]]


def skip_record(
    decision: Decision,
    wanted: HeadFilter,
    *,
    candidates_member: Mapping[int, int],
    holding: Iterable[Holding],
) -> dict[str, Any]:
    """The record of one claim: `decision` over the heads read with
    `wanted` (the pre-filter as first applied); `candidates_member`: each
    head's member, by job id; `holding`: the members with running jobs."""
    skipped = Counter(skip.value for skip in decision.skipped.values())
    limited = {
        candidates_member[job_id]
        for job_id, skip in decision.skipped.items()
        if skip is Skip.RUNNING_LIMIT and job_id in candidates_member
    }
    capped = sorted(wanted.capped_members | limited)[:MAX_CAPPED_MEMBERS]
    by_member = {held.member_id: held for held in holding}
    return {
        "skipped": dict(sorted(skipped.items())),
        "left_out": {
            "running_limit": len(wanted.capped_members),
            "not_served": wanted.models is not None,
            "reserved": wanted.reserved,
        },
        "capped_members": capped,
        "holding": {
            str(member): {
                "limit": by_member[member].limit,
                "jobs": [list(job) for job in by_member[member].jobs],
            }
            for member in capped
            if member in by_member
        },
    }


@dataclass(frozen=True)
class StoredSkips:
    """A kept record, read back."""

    record: Mapping[str, Any]

    def capped(self, member_id: int) -> bool:
        """Whether the running limit kept `member_id`'s heads off the GPU."""
        return member_id in self.record.get("capped_members", ())

    def limit(self, member_id: int) -> int | None:
        """The member's running limit when it was held."""
        return self.record.get("holding", {}).get(str(member_id), {}).get("limit")

    def holders(self, member_id: int) -> list[dict[str, Any]]:
        """The member's running jobs that held its limit: id and GPU."""
        held = self.record.get("holding", {}).get(str(member_id), {})
        return [{"id": job_id, "gpu": gpu} for job_id, gpu in held.get("jobs", ())]
