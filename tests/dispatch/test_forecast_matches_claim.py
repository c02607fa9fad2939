"""The forecast's next starts are the jobs the claims take.

The forecast (queueapp/eta.py) plays the queue with the same `decide` the
claim calls, from facts built the same way (queueapp/policy/facts.py). On
drawn queues, against real PostgreSQL, every start it places at this
instant must be the job the claim of that GPU takes, in the same order, and
a GPU it starts nothing on must claim nothing. Drawn: several GPUs (served
models, reservations, a disabled one), running jobs and parallel slots,
running limits with strict tiers and borrowing guards, pins, and wait
bounds, some of them passed (the claim expires those heads, and so does
the play).
"""

from __future__ import annotations

from datetime import timedelta

import psycopg
import pytest
from django.db.models.functions import Now
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from queueapp import services
from queueapp.dispatch.claim import job_claim_next
from queueapp.dispatch.outcomes import ClaimedJob, ClaimOutcome, HeadsOverdue
from queueapp.eta import queue_forecast
from queueapp.locks import DISPATCHER_LOCK_CLASS
from queueapp.models import Gpu, Job, JobStatus, Member, ModelSetting, RunStats
from queueapp.selectors import db_now
from tests import factories
from tests.dispatch.helpers import drawn_rows_removed, tiers_and_policy

MODELS = ["a", "b", "c"]
MEMBERS = (("ann", "max"), ("bob", "pro"), ("cat", "free"))
GPUS = ("gpu0", "gpu1", "gpu2")

gpu_drawn = st.fixed_dictionaries(
    {
        "serves": st.none() | st.lists(st.sampled_from(MODELS), min_size=1, unique=True),
        "reservation": st.sampled_from([None, "band", "short"]),
        "resident": st.none() | st.sampled_from(MODELS),
    }
)
queued_drawn = st.lists(
    st.tuples(
        st.sampled_from([name for name, _ in MEMBERS]),
        st.sampled_from(["interactive", "normal", "batch"]),
        st.sampled_from(MODELS),
        st.sampled_from(["", "", "", "gpu0", "gpu1"]),  # the GPU it is pinned to
        st.sampled_from([None, None, "passed", "later"]),  # its wait bound
    ),
    min_size=1,
    max_size=12,
)


def claim(gpu: Gpu) -> ClaimOutcome:
    """The dispatcher's claim, with any overdue heads it finds expired first."""
    while True:
        outcome = job_claim_next(resident_model=gpu.resident_model or None, worker="t", gpu=gpu.pk)
        if not isinstance(outcome, HeadsOverdue):
            return outcome
        services.jobs_expire_overdue()


@pytest.mark.django_db
@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    gpus=st.lists(gpu_drawn, min_size=2, max_size=3),
    third_enabled=st.booleans(),
    queued=queued_drawn,
    running=st.lists(
        st.tuples(
            st.sampled_from([name for name, _ in MEMBERS]),
            st.sampled_from(GPUS[:2]),
            st.sampled_from(MODELS),
        ),
        max_size=3,
    ),
    parallel=st.dictionaries(st.sampled_from(MODELS), st.sampled_from([2, 3])),
    limits=st.fixed_dictionaries({tier: st.integers(1, 2) for tier in factories.TIER_DEFAULTS}),
    strict=st.fixed_dictionaries({tier: st.booleans() for tier in factories.TIER_DEFAULTS}),
    keep_idle=st.sampled_from([0, 1]),
    borrow_max_seconds=st.none() | st.just(60.0),
    short_runs=st.dictionaries(st.sampled_from(MODELS), st.sampled_from([5.0, 600.0])),
)
def test_the_forecasts_next_starts_are_the_jobs_the_claims_take(
    lock_session,
    gpus,
    third_enabled,
    queued,
    running,
    parallel,
    limits,
    strict,
    keep_idle,
    borrow_max_seconds,
    short_runs,
):
    try:
        tiers_and_policy(
            limits=limits, strict=strict, keep_idle=keep_idle, borrow_max_seconds=borrow_max_seconds
        )
        members = {name: factories.member(name, tier)[0] for name, tier in MEMBERS}
        rows = _gpus(lock_session, gpus, third_enabled=third_enabled)
        for model, slots in parallel.items():
            ModelSetting.objects.create(name=model, parallel=slots)
        for model, seconds in short_runs.items():
            RunStats.objects.create(
                model=model, path="/v1/chat/completions", warm_seconds=seconds, warm_samples=1
            )
        _running(running, members=members, gpus=rows)
        _queued(queued, members=members)
        for name, gpu in zip(GPUS, gpus, strict=False):
            # Read once the jobs are in: a submission of a model no GPU
            # serves is refused.
            Gpu.objects.filter(name=name).update(served_models=gpu["serves"])

        forecast = queue_forecast()
        # The dispatchers' sweep expires the jobs past their bound within a
        # second; the play expires them at once.
        services.jobs_expire_overdue()
        now = forecast.now.timestamp()
        starting_now = [place for place in forecast.order if place.estimated_start <= now]
        by_name = {row.name: row for row in rows.values()}
        for place in starting_now:
            state = _queue_state()
            outcome = claim(by_name[place.gpu])
            assert isinstance(outcome, ClaimedJob) and outcome.job_id == place.job_id, (
                f"forecast {place}, claimed {outcome}\nplay {forecast.order[:6]}\n{state}"
            )
        for row in rows.values():
            state = _queue_state()
            outcome = claim(row)
            assert not isinstance(outcome, ClaimedJob), (
                f"{row.name} claimed {outcome}\nplay {forecast.order[:6]}\n{state}"
            )
    finally:
        drawn_rows_removed(lock_session)


def _gpus(session: psycopg.Connection, drawn: list[dict], *, third_enabled: bool) -> dict[str, Gpu]:
    """The drawn GPUs, registered, reachable, their dispatchers alive (the
    models they serve are read later)."""
    rows = {}
    for name, gpu in zip(GPUS, drawn, strict=False):
        row = services.gpu_register(name=name, url=f"http://127.0.0.1:9/{name}")
        services.gpu_state_record(
            gpu_id=row.pk,
            reachable=True,
            resident_model=gpu["resident"],
            served_models=None,
        )
        Gpu.objects.filter(pk=row.pk).update(
            min_band=100 if gpu["reservation"] == "band" else None,
            max_expected_seconds=60.0 if gpu["reservation"] == "short" else None,
            enabled=name != "gpu2" or third_enabled,
        )
        session.execute("SELECT pg_advisory_lock(%s, %s)", [DISPATCHER_LOCK_CLASS, row.pk])
        rows[name] = Gpu.objects.get(pk=row.pk)
    return rows


def _running(drawn: list[tuple], *, members: dict[str, Member], gpus: dict[str, Gpu]) -> None:
    """Jobs running since now (so none is expected to end at this instant),
    each in the next slot of its GPU."""
    slots: dict[str, int] = {}
    for owner, on, model in drawn:
        if on not in gpus:
            continue
        job = factories.job(members[owner], model=model, priority="batch")
        slot = slots.get(on, 0)
        slots[on] = slot + 1
        Job.objects.filter(pk=job.pk).update(
            status=JobStatus.RUNNING,
            is_lane_head=False,
            gpu=gpus[on],
            gpu_slot=slot,
            started_at=Now(),
            lease_expires_at=Now() + timedelta(minutes=5),
        )


def _queued(drawn: list[tuple], *, members: dict[str, Member]) -> None:
    now = db_now()
    for owner, band, model, pinned, bound in drawn:
        job = factories.job(members[owner], priority=band, model=model)
        deadline = {
            None: None,
            "passed": now - timedelta(seconds=10),
            "later": now + timedelta(hours=1),
        }[bound]
        Job.objects.filter(pk=job.pk).update(pinned_gpu=pinned, wait_deadline=deadline)


def _queue_state() -> str:
    """The jobs as a claim reads them, one line each, for a failure's message."""
    rows = Job.objects.order_by("id").values_list(
        "id",
        "status",
        "member__name",
        "priority",
        "model",
        "is_lane_head",
        "gpu__name",
        "gpu_slot",
        "pinned_gpu",
        "wait_deadline",
    )
    return "\n".join(" ".join(str(value) for value in row) for row in rows)
