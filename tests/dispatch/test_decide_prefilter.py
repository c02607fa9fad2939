"""The claim's SQL reads only the heads `decide` may pick (decide.prefilter:
the served models, the reservation, the running limit and the jobs pinned
to another GPU filter them where an index helps; a GPU that finds nothing
reads again with the members who may borrow it). It must never drop the
job `decide` would pick from every head, and the front door's admission
must never leave out a GPU that would start a job of the model: drawn
queues, GPUs, running jobs, strict tiers and borrowing guards, against
real PostgreSQL."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from queueapp import services
from queueapp.dispatch.claim import heads_decided
from queueapp.dispatch.room import gpus_with_room_for
from queueapp.dispatch.snapshot import gpu_state_read
from queueapp.locks import DISPATCHER_LOCK_CLASS
from queueapp.models import Gpu, Job, JobStatus, RunStats
from queueapp.policy.decide import Outcome, decide
from queueapp.selectors import job_candidate, queued_lane_heads
from tests import factories
from tests.dispatch.helpers import drawn_rows_removed, tiers_and_policy

MODELS = ["a", "b", "c"]

queued_drawn = st.lists(
    st.tuples(
        st.sampled_from(["ann", "bob", "cat"]),
        st.sampled_from(["interactive", "normal", "batch"]),
        st.sampled_from(MODELS),
        st.sampled_from(["", "", "gpu0", "gpu1"]),  # the GPU it is pinned to
    ),
    min_size=1,
    max_size=12,
)


@pytest.mark.django_db
@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    queued=queued_drawn,
    serves=st.none() | st.lists(st.sampled_from(MODELS), min_size=1, unique=True),
    min_band=st.none() | st.sampled_from([0, 100]),
    short_bound=st.none() | st.just(60.0),
    short_runs=st.dictionaries(st.sampled_from(MODELS), st.sampled_from([5.0, 600.0])),
    running=st.lists(
        st.tuples(st.sampled_from(["ann", "bob", "cat"]), st.sampled_from(["gpu1", "gpu2"])),
        max_size=3,
    ),
    limits=st.fixed_dictionaries({tier: st.integers(1, 2) for tier in factories.TIER_DEFAULTS}),
    strict=st.fixed_dictionaries({tier: st.booleans() for tier in factories.TIER_DEFAULTS}),
    keep_idle=st.sampled_from([0, 1, 2]),
    borrow_max_seconds=st.none() | st.just(60.0),
    resident=st.none() | st.sampled_from(MODELS),
)
def test_the_sql_prefilter_never_drops_the_job_decide_picks(
    lock_session,
    queued,
    serves,
    min_band,
    short_bound,
    short_runs,
    running,
    limits,
    strict,
    keep_idle,
    borrow_max_seconds,
    resident,
):
    try:
        tiers_and_policy(
            limits=limits, strict=strict, keep_idle=keep_idle, borrow_max_seconds=borrow_max_seconds
        )
        members = {
            name: factories.member(name, tier)[0]
            for name, tier in (("ann", "max"), ("bob", "pro"), ("cat", "free"))
        }
        gpus = {}
        for name in ("gpu0", "gpu1", "gpu2"):
            row = services.gpu_register(name=name, url=f"http://127.0.0.1:9/{name}")
            # gpu0 serves the drawn models; the others' lists are unread (any model).
            served = serves if name == "gpu0" else None
            services.gpu_state_record(
                gpu_id=row.pk, reachable=True, resident_model=None, served_models=served
            )
            gpus[name] = row
        Gpu.objects.filter(pk=gpus["gpu0"].pk).update(
            min_band=min_band, max_expected_seconds=short_bound
        )
        for model, seconds in short_runs.items():
            RunStats.objects.create(
                model=model, path="/v1/chat/completions", warm_seconds=seconds, warm_samples=1
            )
        for index, (owner, on) in enumerate(running):
            # A model of its own: the running job leaves no line behind it.
            job = factories.job(members[owner], model=f"busy-{index}")
            Job.objects.filter(pk=job.pk).update(
                status=JobStatus.RUNNING, is_lane_head=False, gpu=gpus[on], gpu_slot=index
            )
        for owner, band, model, pinned in queued:
            job = factories.job(members[owner], priority=band, model=model)
            Job.objects.filter(pk=job.pk).update(pinned_gpu=pinned)

        state = gpu_state_read(gpus["gpu0"].pk)
        snapshot = state.snapshot(resident_model=resident)
        every_head = [job_candidate(job) for job in queued_lane_heads()]
        from_all = decide(replace(snapshot, heads=every_head))
        decided = heads_decided(state, snapshot)
        read, from_read = decided.heads, decided.decision
        assert from_read.outcome is from_all.outcome
        assert from_read.borrowed is from_all.borrowed
        if from_all.chosen is not None:
            assert from_read.chosen is not None
            assert from_read.chosen.candidate.job_id == from_all.chosen.candidate.job_id
        # Whatever SQL read, decide would have read too: the filter only narrows.
        assert {head for head in read} <= {head.job_id for head in every_head}
        # The admission's GPU choice never leaves out a GPU that would start
        # a job of the model now (its dispatcher alive).
        for row in gpus.values():
            lock_session.execute("SELECT pg_advisory_lock(%s, %s)", [DISPATCHER_LOCK_CLASS, row.pk])
        for row in gpus.values():
            state = gpu_state_read(row.pk)
            there = decide(replace(state.snapshot(resident_model=resident), heads=every_head))
            if there.outcome is Outcome.START:
                assert row.pk in gpus_with_room_for(there.chosen.candidate.model), row.name
    finally:
        drawn_rows_removed(lock_session)
