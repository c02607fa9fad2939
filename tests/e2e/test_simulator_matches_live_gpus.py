"""On two GPUs, the policy simulator places and orders a trace as the live system does.

The one-GPU check (test_simulator_matches_live.py) compares one order. Here
the trace below runs twice, through `simulate_on_gpus` with the
`GpuschedOnGpus` policy and through the real system (PostgreSQL, one
django-q2 dispatcher cluster per GPU, two llama-swap simulators over HTTP),
with every rule that decides where a job goes in play:

- parallel slots: `chat-a` runs two at once (`parallel` 2, in the
  dispatcher's model setting and in both HTTP simulators);
- a reservation: gpu0 admits only jobs of band 100 (interactive) or above;
- the running limit: every tier's `max_running_jobs` is 1 (one GPU held).

Each job must run on the same GPU in both, and each GPU must start its jobs
in the same order, in the same slots, with as many jobs in flight beside
them, swapping at the same starts and with the same terms changing each
choice (the decision row's `changed_by_*`). The order of jobs across the
two GPUs is not compared: the live system does not define which of two
GPUs that free at one instant claims first. The trace is designed so that
it never needs to:

- ann (free tier) has five interactive `chat-a` jobs. The reservation
  admits them on gpu0, where two at a time share the GPU's slots; her
  running limit keeps them off gpu1 as long as she holds gpu0, and she holds
  it without a break until her last job has started, because each of her
  jobs ends while the other slot's job still runs.
- bo (pro tier) has five `render-b` jobs, one normal and four batch. The
  reservation keeps every one of them off gpu0, even once gpu0 stands idle;
  gpu1 runs them one at a time, the normal one first. gpu1 frees while ann's
  jobs wait (they outrank bo's by a band) and still takes bo's: the limit.
- So gpu0's choices are only ever among ann's jobs and gpu1's only among
  bo's, whatever the two GPUs' timings are relative to each other. bo has
  a job for gpu1 whenever ann's wait, so the design holds too where a
  member at the limit may borrow a GPU that no other member's job can use.

Inside one GPU the timing matters: which slot frees first, and how many jobs
are in flight when one joins (a batched run is slowed by
`queueapp.policy.batched_seconds`, in both simulators). No two events of
one GPU are less than half a second apart in the simulated run, which
process jitter on a loaded machine does not undo.

What is made deterministic on purpose: every job is submitted while dispatch
is paused (the Policy row), and gpu1 is held disabled until gpu0 has
claimed both its slots. The simulator offers the GPUs of one instant in
name order, so at the first instant gpu0 fills its slots before gpu1
chooses; live, two dispatchers released together race, and a gpu1 that
claimed first would take ann's first job, since the running limit binds only
once a member holds a GPU. Holding gpu1 back for that moment is the
simulator's order of that instant, not a change of the trace.

The simulated run is also checked to use each rule: a job ran in slot 1
beside another; gpu1 took a batch job at an instant gpu0 stood idle and its
member held no GPU (only the reservation kept it off gpu0); gpu1 took bo's
jobs while ann's, a band higher, waited because she held gpu0; and without
each rule the simulated run differs.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping

import pytest

from gpusched.stack import wait_for
from queueapp import services
from queueapp.models import DispatchDecision, Gpu, Job, JobStatus, ModelSetting, Policy
from queueapp.models import Tier as TierRow
from queueapp.policy import TERMS, PolicySettings, Reservation
from queueapp.selectors import policy_settings
from queueapp.simulation.cluster import simulate_on_gpus
from queueapp.simulation.cluster_policies import DEFAULT_BORROWING, GpuschedOnGpus
from queueapp.simulation.engine import Dispatch, Run
from queueapp.simulation.fleet import gpu_specs
from queueapp.simulation.traces import Tier, Trace, TraceJob
from queueapp.upstream.simulator import LlamaSwapSimulator
from tests import factories
from tests.e2e.helpers import submit_trace

pytestmark = [pytest.mark.e2e]

CHAT, RENDER = "chat-a", "render-b"
PARALLEL = {CHAT: 2}
RESERVED = "gpu0"
RESERVATIONS = {RESERVED: Reservation(min_band=100)}
GPUS = ("gpu0", "gpu1")
SWAP_SECONDS = 0.1


def _job(
    label: str, member: str, priority: str, model: str, seconds: float, *, at: float
) -> TraceJob:
    return TraceJob(id=label, member=member, priority=priority, model=model, seconds=seconds, at=at)


# Submitted in this order, all before dispatch is released.
# Simulated, in seconds from the release: gpu0 runs ann-1 (swap included)
# 0-0.90 in slot 0 and ann-2 0-1.71 in slot 1 (batched); ann-3 takes slot 0
# at 0.90, ann-4 slot 1 at 1.71, ann-5 slot 0 at 2.39, each beside another,
# and gpu0 is idle from 3.60. gpu1 runs bo-2 (normal) 0-1.30, then bo-1,
# bo-3, bo-4 and bo-5 (4.30-5.10) one after another.
TRACE = Trace(
    name="two-gpus-live-check",
    description=(
        "ann's interactive chat jobs (parallel 2) on the reserved gpu0, bo's normal and "
        "batch renders on gpu1, every tier limited to one GPU; queued while dispatch is "
        "paused and released at once"
    ),
    jobs=(
        _job("bo-1", "bo", "batch", RENDER, 1.0, at=0.01),
        _job("ann-1", "ann", "interactive", CHAT, 0.8, at=0.02),
        _job("ann-2", "ann", "interactive", CHAT, 1.4, at=0.03),
        _job("bo-2", "bo", "normal", RENDER, 1.2, at=0.04),
        _job("ann-3", "ann", "interactive", CHAT, 1.3, at=0.05),
        _job("bo-3", "bo", "batch", RENDER, 1.1, at=0.06),
        _job("ann-4", "ann", "interactive", CHAT, 1.1, at=0.07),
        _job("ann-5", "ann", "interactive", CHAT, 1.05, at=0.08),
        _job("bo-4", "bo", "batch", RENDER, 0.9, at=0.09),
        _job("bo-5", "bo", "batch", RENDER, 0.8, at=0.10),
    ),
    members={"ann": "free", "bo": "pro"},
    swap_seconds=SWAP_SECONDS,
    duration_seconds=0.1,
    dispatch_from=0.2,
)


def simulated(
    *,
    reservations: Mapping[str, Reservation] = RESERVATIONS,
    parallel: Mapping[str, int] = PARALLEL,
    running_limit: int | None = None,
) -> Run:
    """The trace through the policy simulator; by default with the trace's
    tiers' running limits, and the reservation and slots above."""
    limits = {name: running_limit or tier.max_running_jobs for name, tier in TRACE.tiers.items()}
    # The live claim's default: a GPU no other job can use is lent (borrowing).
    policy = GpuschedOnGpus(PolicySettings(), running_limits=limits, borrowing=DEFAULT_BORROWING)
    return simulate_on_gpus(TRACE, policy, gpu_specs(len(GPUS), reservations), parallel=parallel)


def per_gpu(run: Run) -> dict[str, list[tuple]]:
    """Each GPU's starts in order: the job, its slot, the jobs in flight as
    it started (itself included), whether it swapped, and the terms that
    changed the choice."""
    return {
        gpu: [
            (d.job.job.id, d.slot, d.in_flight, d.swapped, set(d.changed_by))
            for d in run.dispatches
            if d.gpu == gpu
        ]
        for gpu in GPUS
    }


def in_flight_at(run: Run, gpu: str, moment: float) -> list[Dispatch]:
    return [d for d in run.dispatches if d.gpu == gpu and d.started_at <= moment < d.finished_at]


def waiting_at(run: Run, moment: float) -> list[Dispatch]:
    """The jobs submitted by `moment` that started after it."""
    return [d for d in run.dispatches if d.job.submitted_at <= moment < d.started_at]


def shared_slots(run: Run) -> list[Dispatch]:
    """Starts in slot 1 or above, beside a job of the same GPU still in flight."""
    return [
        d
        for d in run.dispatches
        if d.slot >= 1 and d.in_flight >= 2 and len(in_flight_at(run, d.gpu, d.started_at)) >= 2
    ]


def others_in_flight(run: Run, start: Dispatch) -> list[Dispatch]:
    """The jobs of `start`'s member in flight as it started, on any GPU."""
    return [
        d
        for gpu in GPUS
        for d in in_flight_at(run, gpu, start.started_at)
        if d is not start and d.job.member_id == start.job.member_id
    ]


def passed_by_the_idle_reserved_gpu(run: Run) -> list[Dispatch]:
    """Starts on another GPU, below the reservation's band, at an instant the
    reserved GPU stood idle and the job's member held no GPU (so the running
    limit did not bind): the reserved GPU is offered first at an instant
    (name order), and only its reservation kept the job off it."""
    min_band = RESERVATIONS[RESERVED].min_band
    assert min_band is not None
    return [
        start
        for start in run.dispatches
        if start.gpu != RESERVED
        and start.job.band < min_band
        and not in_flight_at(run, RESERVED, start.started_at)
        and not others_in_flight(run, start)
    ]


def kept_off_by_the_running_limit(run: Run) -> list[tuple[Dispatch, Dispatch]]:
    """(start, waiting): an unreserved GPU started a job while a job of a
    higher band waited whose member held another GPU then; that job started
    later on the GPU its member held."""
    return [
        (start, waiting)
        for start in run.dispatches
        if start.gpu not in RESERVATIONS
        for waiting in waiting_at(run, start.started_at)
        if waiting.job.band > start.job.band
        and waiting.gpu != start.gpu
        and any(
            held.job.member_id == waiting.job.member_id
            for held in in_flight_at(run, waiting.gpu, start.started_at)
        )
    ]


def test_the_trace_needs_slots_the_reservation_and_the_running_limit():
    run = simulated()
    assert not run.never_started
    assert {d.job.job.id: d.gpu for d in run.dispatches} == {
        job.id: "gpu0" if job.member == "ann" else "gpu1" for job in TRACE.jobs
    }
    assert [d.job.job.id for d in shared_slots(run)] == ["ann-2", "ann-4"]
    assert [d.job.job.id for d in passed_by_the_idle_reserved_gpu(run)] == ["bo-5"]
    limited = kept_off_by_the_running_limit(run)
    assert {start.job.job.id for start, _ in limited} == {"bo-2", "bo-1", "bo-3"}
    assert {waiting.job.job.member for _, waiting in limited} == {"ann"}
    # Each GPU's events at least half a second apart, so jitter keeps their order.
    for gpu in GPUS:
        moments = sorted(
            {
                round(t, 6)
                for d in run.dispatches
                if d.gpu == gpu
                for t in (d.started_at, d.finished_at)
            }
        )
        assert min(b - a for a, b in itertools.pairwise(moments)) >= 0.5, (gpu, moments)
    # Without any one of the rules, the simulated run is another one.
    assert per_gpu(simulated(parallel={})) != per_gpu(run)
    assert per_gpu(simulated(reservations={})) != per_gpu(run)
    assert per_gpu(simulated(running_limit=2)) != per_gpu(run)


class TwoGpus:
    """Two llama-swap simulators that both serve both models, `chat-a`
    batching two requests at once."""

    def __init__(self) -> None:
        self.sims = {
            name: LlamaSwapSimulator(
                models={CHAT: 0.05, RENDER: 0.05},
                parallel_models=PARALLEL,
                swap_seconds=SWAP_SECONDS,
            ).start()
            for name in GPUS
        }
        self.upstreams = ",".join(f"{name}={sim.url}" for name, sim in self.sims.items())

    def answered(self, name: str) -> list[dict]:
        return [entry for entry in self.sims[name].log() if entry["status"] == 200]

    def stop(self) -> None:
        for sim in self.sims.values():
            sim.stop()


@pytest.fixture
def two_gpus() -> Iterator[TwoGpus]:
    gpus = TwoGpus()
    yield gpus
    gpus.stop()


def gpu_set(name: str, *, enabled: bool = True, min_band: int | None = None) -> None:
    services.gpu_update(
        gpu=Gpu.objects.get(name=name),
        enabled=enabled,
        allowed_models=[],
        min_band=min_band,
        max_expected_seconds=None,
    )


def test_two_gpus_with_slots_a_reservation_and_a_running_limit_run_as_simulated(world, two_gpus):
    run = simulated()
    # The simulated world is the live one: swap cost, tiers, policy, slots.
    for sim in two_gpus.sims.values():
        assert sim.swap_seconds == TRACE.swap_seconds
        assert sim.running() == {"running": []} and TRACE.initial_model is None
    TierRow.objects.filter(name__in=TRACE.members.values()).update(max_running_jobs=1)
    assert {
        row.name: Tier(row.bonus, row.priority_cap, row.priority_floor, row.max_running_jobs)
        for row in TierRow.objects.filter(name__in=TRACE.members.values())
    } == {name: TRACE.tiers[name] for name in TRACE.members.values()}
    assert policy_settings(Policy.objects.get()) == PolicySettings()

    members = {name: factories.member(name, tier)[0] for name, tier in TRACE.members.items()}
    factories.policy(dispatch_paused=True)
    for name in GPUS:
        world.start_cluster(upstream_url=two_gpus.upstreams, GPUSCHED_GPU=name)
    wait_for(
        lambda: Gpu.objects.filter(served_models__contains=[CHAT, RENDER]).count() == len(GPUS),
        message="both dispatchers to read their GPU's models",
    )
    for model, slots in PARALLEL.items():
        services.model_parallel_set(name=model, parallel=slots)
    reservation = RESERVATIONS[RESERVED]
    assert reservation.max_expected_seconds is None
    gpu_set(RESERVED, min_band=reservation.min_band)
    submit_trace(TRACE, members)
    gpu_set("gpu1", enabled=False)  # until gpu0 has chosen: the simulator's order of an instant
    assert not any(sim.log() for sim in two_gpus.sims.values()), "nothing starts while paused"
    factories.policy(dispatch_paused=False)
    first = PARALLEL[CHAT]
    wait_for(
        lambda: DispatchDecision.objects.filter(gpu__name="gpu0").count() >= first,
        message=f"gpu0 to fill its {first} slots",
    )
    gpu_set("gpu1")
    wait_for(
        lambda: (
            Job.objects.filter(status=JobStatus.SUCCEEDED).count() == len(TRACE.jobs)
            and not Job.objects.filter(status__in=[JobStatus.QUEUED, JobStatus.RUNNING]).exists()
        ),
        timeout=60,
        message=f"{len(TRACE.jobs)} jobs to succeed",
    )

    live: dict[str, list[tuple]] = {gpu: [] for gpu in GPUS}
    for decision in DispatchDecision.objects.select_related("job", "gpu").order_by("id"):
        changed = {term for term in TERMS if getattr(decision, f"changed_by_{term}")}
        live[decision.gpu.name].append(
            (
                decision.job.body["user"],
                decision.gpu_slot,
                decision.in_flight,
                decision.swap_needed,
                changed,
            )
        )
    assert live == per_gpu(run)
    # Each GPU's llama-swap answered exactly the jobs its dispatcher claimed, once
    # each, and the one that ran a job is the one recorded on it.
    for gpu in GPUS:
        answered = [entry["body"]["user"] for entry in two_gpus.answered(gpu)]
        assert sorted(answered) == sorted(label for label, *_ in live[gpu])
        assert set(
            Job.objects.filter(body__user__in=answered).values_list("gpu__name", flat=True)
        ) == {gpu}
    assert ModelSetting.objects.get(name=CHAT).parallel == PARALLEL[CHAT]
    assert max(entry["in_flight"] for entry in two_gpus.answered("gpu0")) == PARALLEL[CHAT]
