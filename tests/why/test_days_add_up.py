"""Every answer adds up, on drawn days played through the real code path.

A day is drawn as a list of steps and played against real PostgreSQL, in
process: submissions through the service (wait bounds included, some
refused by the forecast), the dispatcher's claim on 1 to 3 GPUs (slots,
llama-swap's routing as a matrix or groups, borrowing past the running
limit, strict tiers), ends, cuts by an unload, refusals, cancels by callers
who leave, and expiries. The test plays llama-swap: after a start it loads
and unloads what the decision predicted. Each step is its own transaction,
so each has its own database clock.

Then `why` is asked about every job, some also mid-wait. Each answer must
add up to its measured wait, lie inside it, never name the job itself as
what held it, and name only jobs that ran in the stretch it gives them.

`make test` draws GPUSCHED_FUZZ_EXAMPLES days (default 20); `make fuzz-why`
draws 1,400 (over 10,000 jobs) and writes how many it checked to
GPUSCHED_WHY_DAYS_REPORT when set.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from queueapp import services
from queueapp.dispatch.claim import job_claim_next
from queueapp.dispatch.lease import job_end_durable, job_return_to_queue
from queueapp.dispatch.outcomes import ClaimedJob, HeadsOverdue
from queueapp.errors import GpuschedError
from queueapp.locks import DISPATCHER_LOCK_CLASS
from queueapp.models import (
    DispatchDecision,
    Gpu,
    Job,
    JobEvent,
    JobStatus,
    Member,
    ModelSetting,
)
from queueapp.policy.routing import routing_parts
from queueapp.selectors import db_now
from queueapp.upstream.client import UpstreamAnswer
from queueapp.why import job_why
from tests import factories
from tests.dispatch.helpers import drawn_rows_removed, tiers_and_policy
from tests.why.timeline import assert_the_answer_adds_up

EXAMPLES = int(os.environ.get("GPUSCHED_FUZZ_EXAMPLES", "20"))
REPORT = os.environ.get("GPUSCHED_WHY_DAYS_REPORT", "")

OK = UpstreamAnswer(200, "application/json", b'{"ok": true}', None)
MEMBERS = (("ann", "max"), ("bob", "pro"), ("cat", "free"))
MODELS = ("chat-small", "tts-kokoro", "embed-small", "image-xl", "video-wan")
GPU_NAMES = ("gpu0", "gpu1", "gpu2")
STUDIO = yaml.safe_load((Path(__file__).parents[2] / "fixtures/llama-swap/studio.yaml").read_text())
# The same models with llama-swap's legacy groups: chat, speech and
# embeddings resident together; images and video each alone.
GROUPS = {
    "models": STUDIO["models"],
    "groups": {"voice": {"swap": False, "members": ["chat-small", "tts-kokoro", "embed-small"]}},
}
ROUTINGS = {"one at a time": None, "matrix": STUDIO, "groups": GROUPS}

submit = st.tuples(
    st.just("submit"),
    st.sampled_from([name for name, _ in MEMBERS]),
    st.sampled_from(["interactive", "normal", "batch"]),
    st.sampled_from(MODELS),
    st.sampled_from([None, None, None, 0.05, 5.0]),  # its wait bound
)
claim = st.tuples(st.just("claim"), st.integers(0, 2))
# Submissions drawn three times as often as the rest and claims twice: a
# day of about ten jobs, most of which run.
step = st.one_of(
    submit,
    submit,
    submit,
    claim,
    claim,
    st.tuples(st.just("end"), st.integers(0, 9)),
    st.tuples(st.sampled_from(["cut", "refused"]), st.integers(0, 9)),
    st.tuples(st.just("cancel"), st.integers(0, 9)),
    st.tuples(st.just("ask"), st.integers(0, 9)),
)


@dataclass
class Day:
    """The day being played: its GPUs, members, running claims and jobs."""

    gpus: list[Gpu]
    members: dict[str, Member]
    running: list[ClaimedJob] = field(default_factory=list)
    jobs: list[int] = field(default_factory=list)
    asked: int = 0

    def submit(self, owner: str, band: str, model: str, bound: float | None) -> None:
        try:
            job = services.job_submit(
                member=self.members[owner],
                path="/v1/chat/completions",
                body=factories.chat_body(model),
                model=model,
                priority_header=band,
                max_wait=bound,
            )
        except GpuschedError:
            return  # refused at once: no GPU serves it, or its bound cannot be met
        self.jobs.append(job.pk)

    def claim(self, index: int) -> None:
        gpu = Gpu.objects.get(pk=self.gpus[index % len(self.gpus)].pk)
        while True:
            outcome = job_claim_next(
                resident_model=gpu.resident_model or None, worker="day", gpu=gpu.pk
            )
            if not isinstance(outcome, HeadsOverdue):
                break
            services.jobs_expire_overdue()
        if isinstance(outcome, ClaimedJob):
            self.running.append(outcome)
            _play_llama_swap(gpu, outcome)

    def end(self, index: int, how: str) -> None:
        if not self.running:
            return
        claim = self.running.pop(index % len(self.running))
        if how == "end":
            assert job_end_durable(claim=claim, answer=OK, error=None, inline_limit=4096)
        else:
            cut = how == "cut"
            reason = "unloaded" if cut else "llama-swap unreachable"
            assert job_return_to_queue(claim=claim, reason=reason, cut_by_unload=cut)

    def cancel(self, index: int) -> None:
        queued = list(Job.objects.filter(pk__in=self.jobs, status=JobStatus.QUEUED))
        if queued:
            services.job_cancel(job=queued[index % len(queued)], by="caller")

    def ask(self, job_id: int) -> None:
        job = Job.objects.select_related("member__tier").get(pk=job_id)
        answer = job_why(job=job, viewer=job.member)
        # Through JSON, as every caller reads it.
        answer = json.loads(json.dumps(answer, default=str))
        assert_the_answer_adds_up(answer)
        _assert_named_jobs_ran_then(answer)
        self.asked += 1
        for part in answer["parts"]:
            event(f"a part: {part['kind']}")
        if answer["other_gpus"]:
            event("told on one GPU of several")


def _play_llama_swap(gpu: Gpu, claim: ClaimedJob) -> None:
    """llama-swap's side of a start: the decision's predicted load and
    unloads, or the model alone when one model runs at a time."""
    decision = DispatchDecision.objects.filter(job_id=claim.job_id).latest("id")
    swap = decision.swap or {}
    resident = set(gpu.resident_models or ([gpu.resident_model] if gpu.resident_model else []))
    if gpu.routing is None or gpu.one_model_at_a_time:
        resident = {claim.model}
    else:
        resident -= set(swap.get("unloads", []))
        resident.add(claim.model)
    Gpu.objects.filter(pk=gpu.pk).update(
        resident_model=claim.model, resident_models=sorted(resident)
    )


def _runs(job_id: int, now: datetime) -> list[tuple[datetime, datetime]]:
    """Each dispatch of `job_id`: from its decision to the event that ended
    it (its row's finish for the last, or now while it runs)."""
    job = Job.objects.get(pk=job_id)
    ends = list(
        JobEvent.objects.filter(
            job_id=job_id,
            kind__in=[
                JobEvent.Kind.RETURNED_TO_QUEUE,
                JobEvent.Kind.SUCCEEDED,
                JobEvent.Kind.FAILED,
            ],
        ).values_list("at", flat=True)
    )
    runs = []
    for at in DispatchDecision.objects.filter(job_id=job_id).values_list("at", flat=True):
        end = min((moment for moment in ends if moment > at), default=None)
        runs.append((at, end or job.finished_at or now))
    return runs


def _assert_named_jobs_ran_then(answer: dict[str, Any]) -> None:
    """A job an answer names as holding its GPU or its running limit ran
    during the stretch the answer gives it."""
    now = datetime.fromisoformat(answer["as_of"])
    for part in answer["parts"]:
        spans = part.get("intervals") or [{"from": part.get("from"), "to": part.get("to")}]
        stretches = [
            (datetime.fromisoformat(span["from"]), datetime.fromisoformat(span["to"]))
            for span in spans
            if span["from"]
        ]
        named = [holder["id"] for holder in part.get("held_by", [])]
        if part["kind"] in ("running_when_submitted", "dispatched_ahead", "own_earlier_attempt"):
            named.append(part["job"]["id"])
        for job_id in named:
            assert any(
                start < to and end > begin
                for start, end in _runs(job_id, now)
                for begin, to in stretches
            ), (job_id, part)


def _gpus(session: psycopg.Connection, count: int, routing: str, serves: list) -> list[Gpu]:
    rows = []
    for name, served in zip(GPU_NAMES[:count], serves, strict=False):
        row = services.gpu_register(name=name, url=f"http://127.0.0.1:9/{name}")
        services.gpu_state_record(
            gpu_id=row.pk, reachable=True, resident_model=None, served_models=served
        )
        config = ROUTINGS[routing]
        if config is not None:
            services.gpu_routing_record(gpu_id=row.pk, routing=routing_parts(config), error="")
        session.execute("SELECT pg_advisory_lock(%s, %s)", [DISPATCHER_LOCK_CLASS, row.pk])
        rows.append(Gpu.objects.get(pk=row.pk))
    return rows


@pytest.fixture
def lock_session(transactional_db):
    from queueapp.live.events import listener_connection_params

    with psycopg.connect(**listener_connection_params(), autocommit=True) as session:
        yield session
        session.execute("SELECT pg_advisory_unlock_all()")


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    gpu_count=st.integers(1, 3),
    routing=st.sampled_from(sorted(ROUTINGS)),
    serves=st.lists(st.none() | st.just(list(MODELS)) | st.just(list(MODELS[:3])), min_size=3),
    parallel=st.fixed_dictionaries(
        {"chat-small": st.sampled_from([1, 2, 4]), "embed-small": st.sampled_from([1, 2])}
    ),
    limits=st.fixed_dictionaries({tier: st.integers(1, 2) for tier in factories.TIER_DEFAULTS}),
    strict=st.fixed_dictionaries({tier: st.booleans() for tier in factories.TIER_DEFAULTS}),
    steps=st.lists(step, min_size=24, max_size=64),
)
def test_every_answer_on_a_drawn_day_adds_up_to_its_wait(
    lock_session, gpu_count, routing, serves, parallel, limits, strict, steps
):
    try:
        tiers_and_policy(limits=limits, strict=strict, keep_idle=0, borrow_max_seconds=None)
        for model, slots in parallel.items():
            ModelSetting.objects.create(name=model, parallel=slots)
        # The first GPU serves every model, so that no submission is refused
        # for want of one.
        day = Day(
            gpus=_gpus(lock_session, gpu_count, routing, [None, *serves[1:]]),
            members={name: factories.member(name, tier)[0] for name, tier in MEMBERS},
        )
        for action, *args in steps:
            if action == "submit":
                day.submit(*args)
            elif action == "claim":
                day.claim(args[0])
            elif action in ("end", "cut", "refused"):
                day.end(args[0], action)
            elif action == "cancel":
                day.cancel(args[0])
            elif action == "ask" and day.jobs:
                day.ask(day.jobs[args[0] % len(day.jobs)])
        services.jobs_expire_overdue()
        for job_id in day.jobs:
            day.ask(job_id)
        _report(day)
    finally:
        drawn_rows_removed(lock_session)


def _report(day: Day) -> None:
    """Add this day's answers to the long run's count (make fuzz-why)."""
    if not REPORT:
        return
    path = Path(REPORT)
    counts = json.loads(path.read_text()) if path.exists() else {"days": 0, "answers": 0}
    counts["days"] += 1
    counts["answers"] += day.asked
    counts["jobs"] = counts.get("jobs", 0) + len(day.jobs)
    counts["at"] = db_now().isoformat()
    path.write_text(json.dumps(counts))
