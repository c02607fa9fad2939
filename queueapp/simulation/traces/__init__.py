"""Workloads for the policy simulator: the JSONL trace files, read and written.

A trace file is one JSON object per line. The first line is the header (who
the members are, their tiers, the swap cost, how long the trace lasts); each
following line is one job. A job arrives either at a time (`at`, seconds
from the start) or `delay` seconds after another job of the trace finished
(`after`): that is how a client that submits a long chain one unit at a time
behaves. `fixtures/traces/README.md` documents the fields and the traces.

The workloads are generated from a seed (`generators`):

    python -m queueapp.simulation.traces --seed 1   # rewrites fixtures/traces/
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from queueapp.policy import clamp_priority, parse_priority_header
from queueapp.policy.request_size import request_size

TRACES_DIR = Path(__file__).resolve().parents[3] / "fixtures" / "traces"
HOUR = 3600.0
# The tiers as queueapp/fixtures/tiers.json defines them.
DEFAULT_TIERS: dict[str, dict[str, Any]] = {
    "free": {"bonus": 0.0, "cap": 100, "floor": -1000},
    "pro": {"bonus": 1.0, "cap": 100, "floor": -1000},
    "max": {"bonus": 2.0, "cap": 100, "floor": -1000},
}


class TraceError(ValueError):
    """A trace file that cannot be replayed; the message names the line."""


@dataclass(frozen=True)
class Tier:
    bonus: float
    cap: int
    floor: int
    # GPUs a member's jobs may hold at once (several GPUs); one, as the tier's default.
    max_running_jobs: int = 1
    # Never lent a GPU past that limit (gpusched's borrowing, decide.Borrowing).
    strict_running_limit: bool = False

    def record(self) -> dict[str, Any]:
        """The header's entry; the running limit and its strictness only when
        not the defaults, so traces written before they existed read and
        write the same."""
        entry = asdict(self)
        if self.max_running_jobs == 1:
            del entry["max_running_jobs"]
        if not self.strict_running_limit:
            del entry["strict_running_limit"]
        return entry


@dataclass(frozen=True)
class TraceJob:
    id: str
    member: str
    # The X-LlamaSwap-Priority header as the client sends it (None: absent).
    priority: str | None
    model: str
    seconds: float  # its own run time, without a swap
    kind: str = ""
    at: float | None = None
    after: str | None = None
    delay: float = 0.0
    chain: str | None = None
    # The request as sent (sized traces): its path and the body's size
    # fields, a chat's prompt given by its length (`prompt_chars`) to keep
    # the file small; `size` is what queueapp/policy/request_size.py reads
    # from that body (`with_request`), None for a job without a body.
    path: str = ""
    body: dict[str, Any] | None = field(default=None, compare=False)
    prompt_chars: int = 0
    size: float | None = None


def request_body(job: TraceJob) -> dict[str, Any] | None:
    """The body `job` is sent with: its recorded fields, and for a chat its
    prompt as one user message of `prompt_chars` characters."""
    if job.body is None:
        return None
    body = dict(job.body)
    if job.prompt_chars:
        body["messages"] = [{"role": "user", "content": "x" * job.prompt_chars}]
    return body


def with_request(
    job: TraceJob, *, path: str, body: dict[str, Any], prompt_chars: int = 0
) -> TraceJob:
    """`job` sent to `path` with `body`, its size read as a submission reads it."""
    sent = replace(job, path=path, body=body, prompt_chars=prompt_chars)
    read = request_size(path, request_body(sent))
    return replace(sent, size=None if read is None else read.value)


@dataclass(frozen=True)
class Trace:
    name: str
    jobs: tuple[TraceJob, ...]
    members: dict[str, str]  # member -> tier name
    tiers: dict[str, Tier] = field(
        default_factory=lambda: {name: Tier(**spec) for name, spec in DEFAULT_TIERS.items()}
    )
    swap_seconds: float = 1.0
    duration_seconds: float = 0.0  # the arrival window (Cobham's bound spreads load over it)
    initial_model: str | None = None
    # Dispatch is paused until then (jobs queue, none starts), as an operator
    # holding the queue with `dispatch_paused` would.
    dispatch_from: float = 0.0
    # llama-swap's per-model priority (its FIFO scheduler's config), for that baseline.
    model_priority: dict[str, int] = field(default_factory=dict)
    seed: int | None = None
    description: str = ""

    def tier_of(self, job: TraceJob) -> Tier:
        return self.tiers[self.members[job.member]]

    def band_of(self, job: TraceJob) -> int:
        """The applied priority, exactly as a submission computes it."""
        tier = self.tier_of(job)
        return clamp_priority(parse_priority_header(job.priority), floor=tier.floor, cap=tier.cap)

    def tier_bonuses(self) -> dict[str, float]:
        return {name: tier.bonus for name, tier in self.tiers.items()}

    def header(self) -> dict[str, Any]:
        return {
            "trace": self.name,
            "description": self.description,
            "seed": self.seed,
            "duration_seconds": self.duration_seconds,
            "swap_seconds": self.swap_seconds,
            "initial_model": self.initial_model,
            "dispatch_from": self.dispatch_from,
            "tiers": {name: tier.record() for name, tier in self.tiers.items()},
            "members": self.members,
            "model_priority": self.model_priority,
        }


def _job_line(job: TraceJob) -> dict[str, Any]:
    line: dict[str, Any] = {"id": job.id}
    if job.at is not None:
        line["at"] = job.at
    else:
        line.update(after=job.after, delay=job.delay)
    line.update(member=job.member, priority=job.priority, model=job.model)
    line.update(seconds=job.seconds, kind=job.kind)
    if job.chain:
        line["chain"] = job.chain
    if job.body is not None:
        line.update(path=job.path, body=job.body)
        if job.prompt_chars:
            line["prompt_chars"] = job.prompt_chars
    return line


def dump_trace(trace: Trace, path: Path) -> None:
    with path.open("w") as out:
        out.write(json.dumps(trace.header()) + "\n")
        for job in trace.jobs:
            out.write(json.dumps(_job_line(job)) + "\n")


def load_trace(path: Path | str) -> Trace:
    """Read and check a trace file; raises FileNotFoundError or TraceError."""
    path = Path(path)
    lines = [(n, text) for n, text in enumerate(path.read_text().splitlines(), 1) if text.strip()]
    if not lines:
        raise TraceError(f"{path}: empty file; the first line must be the trace header")
    records = []
    for number, text in lines:
        try:
            record = json.loads(text)
        except json.JSONDecodeError as exc:
            raise TraceError(f"{path}:{number}: not JSON ({exc.msg})") from None
        if not isinstance(record, dict):
            raise TraceError(f"{path}:{number}: expected a JSON object")
        records.append((number, record))
    (first, header), *job_records = records
    if "trace" not in header or "members" not in header:
        raise TraceError(
            f"{path}:{first}: the first line must be the header with 'trace' and 'members'"
        )
    try:
        tiers = {
            name: Tier(
                float(spec["bonus"]),
                int(spec["cap"]),
                int(spec["floor"]),
                int(spec.get("max_running_jobs", 1)),
                bool(spec.get("strict_running_limit", False)),
            )
            for name, spec in header.get("tiers", DEFAULT_TIERS).items()
        }
    except (KeyError, TypeError, ValueError) as exc:
        raise TraceError(
            f"{path}:{first}: tiers: each needs bonus, cap and floor ({exc})"
        ) from None
    for name, tier in tiers.items():
        if tier.max_running_jobs < 1:
            raise TraceError(
                f"{path}:{first}: tier {name!r}: max_running_jobs must be at least 1, "
                f"got {tier.max_running_jobs}"
            )
    members = dict(header["members"])
    for member, tier in members.items():
        if tier not in tiers:
            raise TraceError(f"{path}:{first}: member {member!r} has unknown tier {tier!r}")
    jobs = tuple(_parse_job(path, number, record, members) for number, record in job_records)
    _check_references(path, jobs)
    return Trace(
        name=str(header["trace"]),
        description=str(header.get("description", "")),
        seed=header.get("seed"),
        jobs=jobs,
        members=members,
        tiers=tiers,
        swap_seconds=_number(path, first, header, "swap_seconds", 1.0),
        duration_seconds=_number(path, first, header, "duration_seconds", 0.0),
        initial_model=header.get("initial_model") or None,
        dispatch_from=_number(path, first, header, "dispatch_from", 0.0),
        model_priority={str(k): int(v) for k, v in header.get("model_priority", {}).items()},
    )


def _number(path: Path, number: int, record: dict, key: str, default: float) -> float:
    value = record.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise TraceError(f"{path}:{number}: {key} must be a number >= 0, got {value!r}")
    return float(value)


def _parse_job(path: Path, number: int, record: dict, members: dict[str, str]) -> TraceJob:
    where = f"{path}:{number}"
    for key in ("id", "member", "model"):
        if not isinstance(record.get(key), str) or not record[key]:
            raise TraceError(f"{where}: {key} is required (a non-empty string)")
    if record["member"] not in members:
        raise TraceError(f"{where}: member {record['member']!r} is not in the header's members")
    if ("at" in record) == ("after" in record):
        raise TraceError(f"{where}: a job needs exactly one of 'at' and 'after'")
    priority = record.get("priority")
    if priority is not None and not isinstance(priority, str):
        raise TraceError(f"{where}: priority is the header's text (a string) or null")
    job = TraceJob(
        id=record["id"],
        member=record["member"],
        priority=priority,
        model=record["model"],
        seconds=_number(path, number, record, "seconds", 0.0),
        kind=str(record.get("kind", "")),
        at=_number(path, number, record, "at", 0.0) if "at" in record else None,
        after=str(record["after"]) if "after" in record else None,
        delay=_number(path, number, record, "delay", 0.0),
        chain=record.get("chain"),
    )
    if "body" not in record:
        return job
    body, request_path = record["body"], record.get("path")
    if not isinstance(body, dict) or not isinstance(request_path, str) or not request_path:
        raise TraceError(f"{where}: a body is an object, sent to a 'path' (a string)")
    prompt_chars = int(_number(path, number, record, "prompt_chars", 0.0))
    return with_request(job, path=request_path, body=body, prompt_chars=prompt_chars)


def _check_references(path: Path, jobs: Sequence[TraceJob]) -> None:
    by_id: dict[str, TraceJob] = {}
    for job in jobs:
        if job.id in by_id:
            raise TraceError(f"{path}: job id {job.id!r} appears twice")
        by_id[job.id] = job
    for job in jobs:
        seen = {job.id}
        current = job
        while current.after is not None:
            if current.after not in by_id:
                raise TraceError(
                    f"{path}: job {current.id!r} comes after unknown job {current.after!r}"
                )
            current = by_id[current.after]
            if current.id in seen:
                raise TraceError(f"{path}: job {job.id!r} is in a cycle of 'after' references")
            seen.add(current.id)
