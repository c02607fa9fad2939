"""A GPU history written as rows (jobs, their decisions, their runs and
returns) at chosen seconds, so that every part of a `why` answer has a known
length; and what every answer must hold, whatever the history."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest

from queueapp import services
from queueapp.models import Gpu, Job, JobEvent, JobStatus, Member
from queueapp.selectors import db_now
from tests import factories

POLICY = {"aging_divisor": 60.0, "swap_affinity_bonus": 10.0, "band_spacing": 100}


class Timeline:
    """GPUs' history, in seconds from a moment an hour ago."""

    def __init__(self, *gpus: str) -> None:
        self.zero = db_now() - timedelta(hours=1)
        self.gpus = {
            name: services.gpu_register(name=name, url=f"http://127.0.0.1:9/{name}")
            for name in gpus or ("gpu0",)
        }
        self.gpu = next(iter(self.gpus.values()))

    def at(self, second: float) -> datetime:
        return self.zero + timedelta(seconds=second)

    def submitted(self, owner: Member, second: float, **fields: Any) -> Job:
        job = factories.job(owner, **fields)
        Job.objects.filter(pk=job.pk).update(submitted_at=self.at(second))
        return Job.objects.get(pk=job.pk)

    def decided(
        self,
        job: Job,
        second: float,
        *,
        gpu: str | None = None,
        slot: int = 0,
        in_flight: int = 1,
        swap: bool = False,
        terms: dict[str, float] | None = None,
        **fields: Any,
    ) -> Gpu:
        """A decision that started `job` at `second` on `gpu` (the first one
        unless told); `fields` set the decision's others (`skips`,
        `idle_reason`)."""
        on = self.gpus[gpu] if gpu else self.gpu
        affinity = 0.0 if swap else 10.0
        factories.decision(
            job,
            at=self.at(second),
            gpu=on,
            gpu_slot=slot,
            in_flight=in_flight,
            swap_needed=swap,
            resident_model="" if swap else job.model,
            terms=terms
            or {
                "band": job.priority,
                "tier_bonus": job.member.tier.bonus,
                "swap_affinity": affinity,
                "aging": 0.0,
                "effective": job.priority + job.member.tier.bonus + affinity,
            },
            policy=POLICY,
            **fields,
        )
        return on

    def ran(
        self,
        job: Job,
        start: float,
        end: float | None = None,
        *,
        gpu: str | None = None,
        slot: int = 0,
        **decision: Any,
    ) -> None:
        """`job` started at `start` (in `slot`, as `decision` says) and ended
        at `end` (None: it still runs)."""
        on = self.decided(job, start, gpu=gpu, slot=slot, **decision)
        Job.objects.filter(pk=job.pk).update(
            status=JobStatus.RUNNING if end is None else JobStatus.SUCCEEDED,
            started_at=self.at(start),
            finished_at=self.at(end) if end is not None else None,
            gpu=on,
            gpu_slot=slot,
        )

    def returned(
        self, job: Job, start: float, end: float, *, gpu: str | None = None, cut: bool = True
    ) -> None:
        """`job` ran from `start` until llama-swap cut it by an unload (or,
        `cut` false, refused it) at `end`: it went back to the queue."""
        self.decided(job, start, gpu=gpu)
        JobEvent.objects.create(
            job=job,
            kind=JobEvent.Kind.RETURNED_TO_QUEUE,
            at=self.at(end),
            detail={"reason": "unloaded", "cut_by_unload": cut},
        )


def capped(member: Member, *holders: tuple[Job, str], limit: int = 1) -> dict[str, Any]:
    """A kept skip record: `member` held at its running limit by `holders`
    (job and GPU name)."""
    return {
        "skipped": {},
        "left_out": {"running_limit": 1, "not_served": False, "reserved": False},
        "capped_members": [member.pk],
        "holding": {
            str(member.pk): {"limit": limit, "jobs": [[job.pk, gpu] for job, gpu in holders]}
        },
    }


NOTHING_SKIPPED: dict[str, Any] = {"skipped": {}, "left_out": {}, "capped_members": []}


def assert_the_answer_adds_up(answer: dict[str, Any], *, tolerance: float = 0.0015) -> None:
    """What every answer holds: its parts add up to its measured wait (to the
    millisecond, and their shown tenths to its shown tenth), each lies
    inside the wait, it never names its own job as another that held it,
    and its pieces tile the wait."""
    measured = answer["measured_wait_seconds"]
    job = answer["job"]
    counted = [part["seconds"] + part.get("swap_seconds", 0.0) for part in answer["parts"]]
    assert sum(counted) == pytest.approx(measured, abs=tolerance), answer["parts"]
    assert answer["adds_up"], answer
    assert answer["parts_total_seconds"] == pytest.approx(measured, abs=tolerance)
    shown = sum(round(part["shown_seconds"] * 10) for part in answer["parts"])
    assert shown == round(answer["shown_wait_seconds"] * 10), answer["parts"]
    submitted = datetime.fromisoformat(answer["submitted_at"])
    end = submitted + timedelta(seconds=measured)
    for part, seconds in zip(answer["parts"], counted, strict=True):
        assert 0 <= seconds <= measured + tolerance, part
        spans = part.get("intervals") or [{"from": part["from"], "to": part["to"]}]
        for span in spans:
            assert datetime.fromisoformat(span["from"]) >= submitted - timedelta(milliseconds=1)
            assert datetime.fromisoformat(span["to"]) <= end + timedelta(milliseconds=2), part
        if part["kind"] != "own_earlier_attempt":
            assert (part.get("job") or {}).get("id") != job, part
        assert job not in [holder["id"] for holder in part.get("held_by", [])], part
    pieces = answer["pieces"]
    if measured > 0:
        assert pieces[0]["from"] == answer["submitted_at"]
        assert all(a["to"] == b["from"] for a, b in zip(pieces, pieces[1:], strict=False))
