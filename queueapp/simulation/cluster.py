"""Several GPUs behind one queue (or one balancer), on the virtual clock.

Each GPU runs one job at a time, never interrupted, and pays a swap by the
same rule as the one-GPU engine (`queueapp.policy.occupancy_seconds`). The
clock moves from event to event: a submission, or the end of a job. At each
instant the jobs that ended free their GPU first, then the jobs submitted by
then are queued (a balancer assigns each to a GPU now: that is what a
balancer does), then every idle GPU, in name order, asks the policy for a
job, as each GPU's dispatcher claims when it frees. Only an event changes
what an idle GPU may take (a member's running limit frees at an end, a
model's learned run time changes at an end, new work arrives), so a GPU
given nothing waits for the next one.

With one GPU and a one-GPU policy this is `engine.simulate` dispatch for
dispatch (tests/simulation/test_cluster.py replays every committed trace
through both).

Parallel slots: a model's `parallel` N lets a GPU run up to N of its jobs at
once while it is resident (a batching server), by the rules the live
dispatcher and the HTTP simulator (queueapp/upstream/simulator/gpu.py)
follow. A GPU with fewer than N jobs of its model in flight offers the free
slot to the policy exactly as an idle GPU would (affinity for that model);
a job of the model takes the slot, and a job of another model makes the GPU
drain: no new slot until its jobs end, then the choice is made afresh. So
a stream of short jobs cannot hold a swap off forever, and a swap still
starts only on an empty GPU. A job's run is `batched_seconds` for the jobs
in flight as it starts, fixed then; one that joins a model still loading
waits out the rest of the load. With every model at 1 no slot is ever
offered beside a running job, which is the size-1 rule above, unchanged.

Resident sets: given llama-swap's routing (`routing`), each GPU keeps the
set of models it runs (from the trace's initial model), and `decide` reads
it (`GpuSnapshot.sets`, queueapp/policy/resident_sets.py): a job of another
model starts beside the jobs in flight when decide says START, paying a
load when its model is not running; what the load unloads leaves the set
(`ResidentSet.after_serving`). DRAIN is recorded as a drain; FULL offers
nothing. A GPU offers a slot while any model could start there. Jobs side
by side slow each other by `batched_seconds` over every job on the GPU,
of whatever model, as the HTTP simulator does. Without a routing nothing
here changes.

A reservation keeps a GPU for some work: it admits a job when its band is at
least `min_band`, or when its model's expected run time is under
`max_expected_seconds`, the rule of `queueapp.policy.Reservation`. The expected run time is
what the live dispatcher learns: the mean of the model's runs finished so
far (without swap); a model with none finished is not known to be short, so
only its band can admit it.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from queueapp.policy import Reservation
from queueapp.policy.decide import GpuSnapshot
from queueapp.policy.occupancy import batched_seconds, occupancy_seconds
from queueapp.policy.resident_sets import ResidentSet
from queueapp.policy.routing import RoutingConfig
from queueapp.simulation.callers import Callers, on_caller_gone
from queueapp.simulation.engine import (
    Arrivals,
    Choice,
    Dispatch,
    Drain,
    QueuedJob,
    Run,
    SchedulingPolicy,
)
from queueapp.simulation.estimates import SIZE, Learned, RunEstimates, forecast_submission
from queueapp.simulation.fleet import GpuSpec, check_parallel
from queueapp.simulation.traces import Trace


@dataclass(frozen=True)
class GpuView:
    """One GPU as a decision sees it."""

    index: int
    name: str
    resident: str | None
    busy: bool  # a job in flight (a free slot beside it is offered all the same)
    reservation: Reservation | None = None
    in_flight: int = 0
    slots: int = 1  # the resident model's parallel: how many of its jobs run at once
    # llama-swap's routing with what runs there; None: one model at a time.
    sets: ResidentSet | None = None


@dataclass(frozen=True)
class ClusterView:
    """What a decision may know beyond its own GPU: the other GPUs, each
    member's running jobs, and each model's learned run time."""

    gpus: tuple[GpuView, ...]
    # Running jobs per (member, GPU index).
    running_by_member: Mapping[tuple[int, int], int]
    learned_seconds: Mapping[str, float]

    def gpus_held(self) -> dict[int, frozenset[str]]:
        """Per member, the GPUs (by name) their running jobs hold: a tier's
        running limit counts these, and jobs sharing one GPU's slots hold one."""
        held: dict[int, set[str]] = {}
        for (member, index), running in self.running_by_member.items():
            if running:
                held.setdefault(member, set()).add(self.gpus[index].name)
        return {member: frozenset(names) for member, names in held.items()}

    def snapshot_of(self, gpu: GpuView) -> GpuSnapshot:
        """`gpu` as `decide` reads it. A reservation's short models are those
        whose mean run so far is under its bound: a model is not known to be
        short before its first end."""
        reservation = gpu.reservation or Reservation()
        in_flight_model = gpu.resident if gpu.in_flight else None
        resident_models: frozenset[str] = frozenset()
        if gpu.sets is not None:
            # Several models may be in flight: one only when all its jobs are.
            busy = {name for name, count in gpu.sets.in_flight.items() if count}
            in_flight_model = next(iter(busy)) if len(busy) == 1 else None
            resident_models = gpu.sets.running_names
        return GpuSnapshot(
            name=gpu.name,
            resident_model=gpu.resident,
            resident_models=resident_models,
            min_band=reservation.min_band,
            short_models=reservation.short_models(self.learned_seconds),
            slots_taken=frozenset(range(gpu.in_flight)),
            in_flight_model=in_flight_model,
            slots=gpu.slots,
            sets=gpu.sets,
        )


class ClusterPolicy(Protocol):
    """Chooses a job for a GPU that is idle; told of each arrival and dispatch."""

    name: str

    def arrived(self, queued: QueuedJob, *, cluster: ClusterView) -> None:
        """`queued` was just submitted (a balancer assigns it here)."""
        ...

    def choose(
        self, queue: Sequence[QueuedJob], *, now: float, gpu: GpuView, cluster: ClusterView
    ) -> Choice | None:
        """The job `gpu` starts now, or None to stay idle until the next event."""
        ...

    def dispatched(self, chosen: QueuedJob, *, gpu: GpuView, at: float) -> None: ...


class SharedQueue:
    """A one-GPU policy in front of several GPUs: one queue, and each GPU that
    is idle takes the job the policy would choose for it."""

    def __init__(self, policy: SchedulingPolicy) -> None:
        self.policy = policy
        self.name = policy.name

    def arrived(self, queued: QueuedJob, *, cluster: ClusterView) -> None:
        return None

    def choose(
        self, queue: Sequence[QueuedJob], *, now: float, gpu: GpuView, cluster: ClusterView
    ) -> Choice | None:
        return self.policy.choose(queue, now=now, resident=gpu.resident) if queue else None

    def dispatched(self, chosen: QueuedJob, *, gpu: GpuView, at: float) -> None:
        self.policy.dispatched(chosen, at=at)


@dataclass
class _Gpu:
    spec: GpuSpec
    resident: str | None
    in_flight: dict[int, Dispatch] = field(default_factory=dict)  # slot -> its job
    loaded_at: float = 0.0  # when the resident model's cold load is over
    # A slot was withheld for a job of another model; each later event
    # decides again (as each live claim does), until it empties or a job of
    # its model wins the slot back.
    draining: bool = False
    # With resident sets: the models running, when each one's load is over,
    # and the job the GPU drains for (a drain for another job is a new one).
    running: frozenset[str] = frozenset()
    loaded_at_by_model: dict[str, float] = field(default_factory=dict)
    drained_for: int | None = None


@dataclass
class _Replay:
    """One replay between two events: the GPUs, the queue, when each job in
    flight ends, and what the policy's view is built from."""

    trace: Trace
    policy: ClusterPolicy
    slots: dict[str, int]
    arrivals: Arrivals
    fleet: list[_Gpu]
    run: Run
    queue: list[QueuedJob] = field(default_factory=list)
    ends: list[tuple[float, int, int]] = field(default_factory=list)  # (end, GPU index, slot)
    running_by_member: Counter[tuple[int, int]] = field(default_factory=Counter)
    learned: Learned = field(default_factory=Learned)
    # The estimates learned as the live system learns them, and whether each
    # submission is forecast with them (estimates.py).
    estimates: RunEstimates = field(default_factory=RunEstimates)
    forecasts: bool = False
    callers: Callers = field(default_factory=Callers)
    deadlines: list[tuple[float, int]] = field(default_factory=list)  # (bound's end, job id)
    top_band: int = 0
    routing: RoutingConfig | None = None

    def resident_set(self, gpu: _Gpu) -> ResidentSet | None:
        if self.routing is None:
            return None
        in_flight = Counter(dispatch.job.model for dispatch in gpu.in_flight.values())
        return ResidentSet(self.routing, gpu.running, in_flight, self.slots)

    def view(self) -> ClusterView:
        return ClusterView(
            gpus=tuple(
                GpuView(
                    index=index,
                    name=gpu.spec.name,
                    resident=gpu.resident,
                    busy=bool(gpu.in_flight),
                    reservation=gpu.spec.reservation,
                    in_flight=len(gpu.in_flight),
                    slots=self.slots.get(gpu.resident or "", 1),
                    sets=self.resident_set(gpu),
                )
                for index, gpu in enumerate(self.fleet)
            ),
            running_by_member=self.running_by_member,
            learned_seconds=self.learned.mean,
        )

    def has_free_slot(self, gpu: _Gpu) -> bool:
        if not gpu.in_flight:
            return True
        sets = self.resident_set(gpu)
        if sets is not None:
            return not sets.full()
        return len(gpu.in_flight) < self.slots.get(gpu.resident or "", 1)

    def end_jobs(self, now: float) -> None:
        """The jobs ended by `now` free their slots; a GPU emptied ends its
        drain, and each run teaches its model's expected run time."""
        while self.ends and self.ends[0][0] <= now:
            _, index, slot = heapq.heappop(self.ends)
            gpu = self.fleet[index]
            done = gpu.in_flight.pop(slot)
            if not gpu.in_flight:
                gpu.draining = False
                gpu.drained_for = None
            self.running_by_member[done.job.member_id, index] -= 1
            if done.caller_left_at is not None and not done.drained_seconds:
                continue  # closed early: not a whole run to learn from
            self.learned.finished(
                done.job.model, batched_seconds(done.job.job.seconds, done.in_flight)
            )
            if done.in_flight == 1:
                self.estimates.finished(done.job.job, done.job.job.seconds)

    def queue_arrivals(self, now: float) -> None:
        for arrived in self.arrivals.until(now):
            expected = self.estimates.expected(arrived.job, SIZE).p50
            queued = replace(arrived, expected_seconds=expected)
            self.queue.append(queued)
            if self.forecasts:
                self.run.forecasts.append(forecast_submission(self, queued, now=now))
            bound = self.callers.bound_of(queued.job)
            if bound is not None:
                heapq.heappush(self.deadlines, (queued.submitted_at + bound, queued.job_id))
            self.policy.arrived(queued, cluster=self.view())

    def expire(self, now: float) -> None:
        """The jobs whose wait bound has passed by `now` and that are still
        queued leave the queue (a job that starts at its deadline made it)."""
        while self.deadlines and self.deadlines[0][0] <= now:
            deadline, job_id = heapq.heappop(self.deadlines)
            queued = next((q for q in self.queue if q.job_id == job_id), None)
            if queued is not None:
                self.queue.remove(queued)
                self.run.expired.append((queued, deadline))

    def offer_slots(self, index: int, now: float) -> None:
        """An idle GPU takes a job; then, at the same instant, each free
        slot beside it is offered in turn, until the policy chooses nothing
        or a job of another model makes the GPU drain."""
        gpu = self.fleet[index]
        while self.queue and self.has_free_slot(gpu):
            cluster = self.view()
            here = cluster.gpus[index]
            choice = self.policy.choose(self.queue, now=now, gpu=here, cluster=cluster)
            if choice is None:
                break
            if here.sets is not None:
                if choice.drains:
                    self.drain(gpu, choice.job, now)
                    break
                # A job that changes nothing may start during a drain: the
                # drain ends only when the job drained for starts.
                if gpu.drained_for == choice.job.job_id:
                    gpu.draining, gpu.drained_for = False, None
                self.dispatch(index, here, choice, now)
                continue
            if gpu.in_flight and choice.job.model != gpu.resident:
                self.drain(gpu, choice.job, now)
                break
            gpu.draining = False
            self.dispatch(index, here, choice, now)

    def drain(self, gpu: _Gpu, chosen: QueuedJob, now: float) -> None:
        """`chosen`, of another model, won a slot beside running jobs: no
        new slot until they end. Recorded once per drain."""
        if gpu.draining and (self.routing is None or gpu.drained_for == chosen.job_id):
            return  # the same drain, decided again
        gpu.draining = True
        gpu.drained_for = chosen.job_id
        self.run.drains.append(
            Drain(
                gpu.spec.name,
                now,
                chosen,
                in_flight=len(gpu.in_flight),
                dispatches_before=len(self.run.dispatches),
            )
        )

    def dispatch(self, index: int, here: GpuView, choice: Choice, now: float) -> None:
        chosen = choice.job
        self.queue.remove(chosen)
        self.policy.dispatched(chosen, gpu=here, at=now)
        dispatch = _start(
            self.fleet[index],
            chosen,
            choice,
            now=now,
            swap_seconds=self.trace.swap_seconds,
            sets=here.sets,
        )
        if self.callers.leaves(chosen.job, top_band=chosen.band == self.top_band):
            dispatch = self.caller_leaves(self.fleet[index], dispatch)
        self.run.dispatches.append(dispatch)
        self.running_by_member[chosen.member_id, index] += 1
        heapq.heappush(self.ends, (dispatch.finished_at, index, dispatch.slot))
        self.arrivals.release_after(chosen.job, finished_at=dispatch.finished_at)

    def caller_leaves(self, gpu: _Gpu, dispatch: Dispatch) -> Dispatch:
        """Its caller leaves part-way: a closed request frees the GPU then;
        a drained one holds it to the end, the rest counted as drained."""
        held = dispatch.finished_at - dispatch.started_at
        left_at = dispatch.started_at + held * self.callers.leave_at
        if on_caller_gone(dispatch.job.job) == "close":
            dispatch = replace(dispatch, finished_at=left_at, caller_left_at=left_at)
        else:
            drained = dispatch.finished_at - left_at
            dispatch = replace(dispatch, caller_left_at=left_at, drained_seconds=drained)
        gpu.in_flight[dispatch.slot] = dispatch
        return dispatch

    def next_event_at(self, now: float) -> float | None:
        """The next submission, end or wait bound (never before `now`);
        None when there is none."""
        next_times = (
            ([self.arrivals.next_at] if self.arrivals else [])
            + ([self.ends[0][0]] if self.ends else [])
            + ([self.deadlines[0][0]] if self.deadlines and self.queue else [])
        )
        if not next_times:
            return None
        return max(now, min(next_times))


def simulate_on_gpus(
    trace: Trace,
    policy: ClusterPolicy,
    gpus: Sequence[GpuSpec],
    *,
    parallel: Mapping[str, int] | None = None,
    callers: Callers | None = None,
    routing: RoutingConfig | None = None,
    forecasts: bool = False,
) -> Run:
    """Replay `trace` on `gpus` (each starting with the trace's initial model);
    `parallel` gives a model's slots (absent: 1, one job at a time);
    `callers`, who bounds their wait and who leaves mid-run (callers.py);
    `routing`, llama-swap's sets on every GPU (None: one model at a time);
    `forecasts`, each submission's start forecast by each estimate
    (estimates.py: gpusched's setups only)."""
    if not gpus:
        raise ValueError("at least one GPU")
    slots = check_parallel(parallel or {})
    initial = frozenset({trace.initial_model} if trace.initial_model else ())
    replay = _Replay(
        trace=trace,
        policy=policy,
        slots=slots,
        arrivals=Arrivals(trace),
        fleet=[_Gpu(spec, trace.initial_model, running=initial) for spec in gpus],
        run=Run(
            trace=trace,
            policy=policy.name,
            gpus=tuple(spec.name for spec in gpus),
            parallel=dict(slots),
            callers=callers.describe() if callers else "",
        ),
        callers=callers or Callers(),
        top_band=max((trace.band_of(job) for job in trace.jobs), default=0),
        routing=routing,
        forecasts=forecasts,
    )
    # Each instant in the order of the module's docstring: ends, then
    # arrivals, then each GPU in name order, then the wait bounds passed.
    now: float | None = trace.dispatch_from
    while now is not None:
        replay.end_jobs(now)
        replay.queue_arrivals(now)
        for index in range(len(replay.fleet)):
            replay.offer_slots(index, now)
        replay.expire(now)
        now = replay.next_event_at(now)
    replay.run.never_started = list(replay.queue)
    return replay.run


def _start(
    gpu: _Gpu,
    chosen: QueuedJob,
    choice: Choice,
    *,
    now: float,
    swap_seconds: float,
    sets: ResidentSet | None,
) -> Dispatch:
    """`chosen` takes the GPU's lowest free slot now: on an empty GPU with a
    swap when its model is not the resident one; beside jobs of its model,
    after the rest of a load still under way. With resident sets, beside
    jobs of any model (`_held_in_set`)."""
    in_flight = len(gpu.in_flight) + 1
    run_seconds = batched_seconds(chosen.job.seconds, in_flight)
    if sets is not None:
        swapped, held = _held_in_set(
            gpu, chosen.model, sets, now=now, run_seconds=run_seconds, swap_seconds=swap_seconds
        )
    elif gpu.in_flight:
        swapped = False
        held = max(0.0, gpu.loaded_at - now) + run_seconds
    else:
        swapped = chosen.model != gpu.resident
        held = occupancy_seconds(
            resident=gpu.resident,
            model=chosen.model,
            seconds=run_seconds,
            swap_seconds=swap_seconds,
        )
        gpu.loaded_at = now + (swap_seconds if swapped else 0.0)
    slot = next(n for n in range(in_flight) if n not in gpu.in_flight)
    dispatch = Dispatch(
        chosen,
        now,
        now + held,
        swapped,
        choice.changed_by,
        gpu=gpu.spec.name,
        placed=choice.placed,
        borrowed=choice.borrowed,
        slot=slot,
        in_flight=in_flight,
    )
    gpu.in_flight[slot] = dispatch
    gpu.resident = chosen.model
    return dispatch


def _held_in_set(
    gpu: _Gpu, name: str, sets: ResidentSet, *, now: float, run_seconds: float, swap_seconds: float
) -> tuple[bool, float]:
    """Whether a job of `name` loads its model, and how long it holds its
    slot: a load first when its model is not running, else the rest of a
    load still under way. Its load's unloads leave the running set
    (decide started it, so none of them has a job in flight)."""
    model = sets.model_id(name)
    swap = sets.swap(name)
    swapped = swap is not None and swap.loads is not None
    for unloaded in swap.unloads if swap is not None else ():
        gpu.loaded_at_by_model.pop(unloaded, None)
    if swapped:
        gpu.loaded_at_by_model[model] = now + swap_seconds
    gpu.running = sets.after_serving(name)
    return swapped, max(0.0, gpu.loaded_at_by_model.get(model, now) - now) + run_seconds
