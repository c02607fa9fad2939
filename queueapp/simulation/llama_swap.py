"""llama-swap alone with its sets: v250's FIFO scheduler under a routing config.

The one-GPU baselines (baselines.py) run one model at a time. llama-swap v250
keeps every model its routing allows together resident, and its FIFO
scheduler (internal/router/scheduler/fifo.go) decides per request:

1. a swap to the same model is under way: the request joins it;
2. fast path: the model is ready and nothing is to be unloaded: it is served
   at once, whatever is queued;
3. its unloads collide with a swap under way (that swap's target, or a model
   that swap unloads): it queues;
4. it would unload a model with requests in flight: it queues;
5. otherwise its swap starts, beside any other swap it does not collide with.

The queue is kept in `routing.scheduler.settings.fifo.priority` order (higher
first, arrival order among equals; unlisted models 0) and is walked again, in
order, whenever a swap ends or a model's last request ends; what is still
blocked keeps its place. What to unload is `queueapp.policy.routing.evictions`.

What the replay makes simple, each said where it matters: a load costs the
trace's `swap_seconds` and a stop nothing; requests running side by side,
of one model or of several, slow each other by the rule the simulators use
for parallel slots (`queueapp.policy.occupancy.batched_seconds` for the
requests running on the GPU as one starts, fixed then); a model serves at
most its `concurrencyLimit` requests at once (fifo.go's default 10) and the
rest wait at the model in order, where llama-swap answers 429 to a request
past the limit (a client that retries gets about this); no `ttl` unloads.
A request's wait runs from its submission to its start, a swap's first
request starting as its load starts (as engine.py counts a swap), the
requests that joined it when it ends.

On several GPUs (`simulate_llama_swap_round_robin`) each GPU runs its own
llama-swap with the same config, behind a balancer that sends the n-th
request to GPU n mod N at its arrival, as `round-robin+collate` does for
one model at a time (cluster_policies.py).
"""

from __future__ import annotations

import heapq
from collections import defaultdict, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from queueapp.policy.occupancy import batched_seconds
from queueapp.policy.routing import (
    RoutingConfig,
    RoutingConfigError,
    UnknownModel,
    evictions,
    resolve,
    routing_from_config,
)
from queueapp.simulation.baselines import FifoCollate
from queueapp.simulation.engine import Arrivals, Dispatch, QueuedJob, Run, simulate
from queueapp.simulation.fleet import gpu_names
from queueapp.simulation.traces import Trace

NAME = "llama-swap-sets"
RULE = (
    "llama-swap v250's FIFO scheduler with a routing config's sets (`--llama-swap-config`): "
    "models allowed together run side by side; a ready model with nothing to unload is "
    "served at once; otherwise requests queue in the config's fifo priority order, and a "
    "swap waits while a model it would unload has requests in flight; without a config, "
    "`fifo-collate`"
)
ROUND_ROBIN_NAME = "llama-swap-sets+round-robin"
ROUND_ROBIN_RULE = (
    f"each GPU's own llama-swap ({NAME}) behind a balancer that sends the n-th request "
    "to GPU n mod N at its arrival"
)
# fifo.go: a model without concurrencyLimit serves this many requests at once.
DEFAULT_CONCURRENCY_LIMIT = 10
PRIORITY_KEY = "routing.scheduler.settings.fifo.priority"


@dataclass(frozen=True)
class LlamaSwapConfig:
    routing: RoutingConfig
    priority: Mapping[str, int]  # model id -> fifo priority

    def limit(self, model: str) -> int:
        return self.routing.models[model].concurrency_limit or DEFAULT_CONCURRENCY_LIMIT


def llama_swap_config(config: Mapping) -> LlamaSwapConfig:
    """The routing and the FIFO priorities of a llama-swap config (YAML loaded).

    Raises RoutingConfigError, naming the key, where llama-swap would refuse it.
    """
    routing = routing_from_config(config)
    raw: object = config
    for key in ("routing", "scheduler", "settings", "fifo", "priority"):
        raw = raw.get(key) if isinstance(raw, Mapping) else None
    if raw is None:
        return LlamaSwapConfig(routing, {})
    if not isinstance(raw, Mapping):
        raise RoutingConfigError(PRIORITY_KEY, "must be a mapping of model id to integer")
    priority = {}
    for name, value in raw.items():
        if not isinstance(value, int) or isinstance(value, bool):
            raise RoutingConfigError(f"{PRIORITY_KEY}.{name}", "must be an integer")
        try:
            priority[resolve(routing, str(name))] = value
        except UnknownModel:
            raise RoutingConfigError(PRIORITY_KEY, f"unknown model {name!r}") from None
    return LlamaSwapConfig(routing, priority)


@dataclass
class _Swap:
    target: str
    unloads: frozenset[str]
    started_at: float
    waiters: list[QueuedJob] = field(default_factory=list)


class _Scheduler:
    """fifo.go's decision tree over the replay's state."""

    def __init__(
        self, trace: Trace, config: LlamaSwapConfig, run: Run, arrivals: Arrivals, gpu: str = ""
    ) -> None:
        self.trace = trace
        self.config = config
        self.run = run
        # Shared by every GPU's scheduler: a chain's next unit follows an end anywhere.
        self.arrivals = arrivals
        self.gpu = gpu
        self.ready: set[str] = set()
        self.swaps: dict[str, _Swap] = {}
        self.queue: list[QueuedJob] = []
        self.in_flight: defaultdict[str, int] = defaultdict(int)  # granted, not ended
        self.serving: defaultdict[str, int] = defaultdict(int)  # running now
        self.at_model: defaultdict[str, deque[tuple[QueuedJob, bool, float]]] = defaultdict(deque)
        # (time, order, kind, model): "swap" done or "serve" ended.
        self.events: list[tuple[float, int, str, str]] = []
        self.order = 0
        if trace.initial_model is not None:
            self.ready.add(self.model(trace.initial_model))

    def model(self, name: str) -> str:
        return resolve(self.config.routing, name)

    def next_event_at(self) -> float:
        return self.events[0][0] if self.events else float("inf")

    def on_next_event(self) -> None:
        now, _, kind, model = heapq.heappop(self.events)
        if kind == "swap":
            self.on_swap_done(model, now)
        else:
            self.on_serve_done(model, now)

    def running(self, exclude: str) -> frozenset[str]:
        """fifo.go's runningSet: loaded models and other swaps' targets."""
        return frozenset(self.ready | (self.swaps.keys() - {exclude}))

    def collides(self, target: str, unloads: frozenset[str]) -> bool:
        return any(
            other in unloads or target in swap.unloads or unloads & swap.unloads
            for other, swap in self.swaps.items()
            if other != target
        )

    def attempt(self, queued: QueuedJob, now: float) -> bool:
        """Joins, is served or starts a swap (True), or must queue (False)."""
        model = self.model(queued.model)
        if model in self.swaps:
            self.swaps[model].waiters.append(queued)
            return True
        unloads = evictions(self.config.routing, self.running(model), model)
        if model in self.ready and not unloads and not self.collides(model, unloads):
            self.grant(queued, model, now, swapped=False, started=now)
            return True
        if self.collides(model, unloads):
            return False
        if any(self.in_flight[busy] > 0 for busy in unloads):
            return False
        self.ready -= unloads
        self.swaps[model] = _Swap(model, unloads, now, [queued])
        self.push(now + self.trace.swap_seconds, "swap", model)
        return True

    def on_request(self, queued: QueuedJob, now: float) -> None:
        if not self.attempt(queued, now):
            self.enqueue(queued)

    def enqueue(self, queued: QueuedJob) -> None:
        """Before the first queued request of a strictly lower priority."""
        rank = self.priority(queued)
        place = next(
            (n for n, other in enumerate(self.queue) if self.priority(other) < rank),
            len(self.queue),
        )
        self.queue.insert(place, queued)

    def priority(self, queued: QueuedJob) -> int:
        return self.config.priority.get(self.model(queued.model), 0)

    def drain(self, now: float) -> None:
        pending, self.queue = self.queue, []
        self.queue = [queued for queued in pending if not self.attempt(queued, now)]

    def on_swap_done(self, model: str, now: float) -> None:
        swap = self.swaps.pop(model)
        self.ready.add(model)
        first, *joined = swap.waiters
        self.grant(first, model, now, swapped=True, started=swap.started_at)
        for queued in joined:
            self.grant(queued, model, now, swapped=False, started=now)
        self.drain(now)

    def on_serve_done(self, model: str, now: float) -> None:
        self.serving[model] -= 1
        self.in_flight[model] -= 1
        if self.at_model[model]:
            queued, swapped, _ = self.at_model[model].popleft()
            self.serve(queued, model, now, swapped=swapped, started=now)
        if self.in_flight[model] == 0:
            self.drain(now)

    def grant(
        self, queued: QueuedJob, model: str, now: float, *, swapped: bool, started: float
    ) -> None:
        """Handed to the model, which runs it when one of its slots is free."""
        self.in_flight[model] += 1
        if self.serving[model] < self.config.limit(model):
            self.serve(queued, model, now, swapped=swapped, started=started)
        else:
            self.at_model[model].append((queued, swapped, now))

    def serve(
        self, queued: QueuedJob, model: str, now: float, *, swapped: bool, started: float
    ) -> None:
        self.serving[model] += 1
        on_gpu = sum(self.serving.values())
        finished = now + batched_seconds(queued.job.seconds, on_gpu)
        self.run.dispatches.append(
            Dispatch(
                queued,
                started,
                finished,
                swapped,
                frozenset(),
                gpu=self.gpu,
                in_flight=on_gpu,
            )
        )
        self.arrivals.release_after(queued.job, finished_at=finished)
        self.push(finished, "serve", model)

    def push(self, at: float, kind: str, model: str) -> None:
        heapq.heappush(self.events, (at, self.order, kind, model))
        self.order += 1


def _replay(schedulers: Sequence[_Scheduler], arrivals: Arrivals, trace: Trace) -> None:
    """Every GPU's events and the arrivals in time order, an end or a load
    before an arrival at the same instant (the first GPU first on a tie);
    the n-th request goes to GPU n mod N."""
    sent = 0

    def send(now: float) -> None:
        nonlocal sent
        for queued in arrivals.until(now):
            schedulers[sent % len(schedulers)].on_request(queued, now)
            sent += 1

    send(trace.dispatch_from)
    while arrivals or any(scheduler.events for scheduler in schedulers):
        next_arrival = arrivals.next_at if arrivals else float("inf")
        first = min(schedulers, key=_Scheduler.next_event_at)
        if first.events and first.next_event_at() <= next_arrival:
            first.on_next_event()
        else:
            send(next_arrival)


def _check_models(trace: Trace, config: LlamaSwapConfig) -> None:
    named = {job.model for job in trace.jobs}
    if trace.initial_model is not None:
        named.add(trace.initial_model)
    unknown = sorted(named - set(config.routing.models) - set(config.routing.aliases))
    if unknown:
        raise UnknownModel(f"the trace's models not in the config: {', '.join(unknown)}")


def simulate_llama_swap(trace: Trace, config: LlamaSwapConfig | None) -> Run:
    """llama-swap alone on one GPU, with the config's sets; without a config,
    `fifo-collate` (one model at a time), its figures unchanged."""
    if config is None:
        run = simulate(trace, FifoCollate())
        run.policy = NAME
        return run
    _check_models(trace, config)
    run = Run(trace=trace, policy=NAME)
    arrivals = Arrivals(trace)
    _replay([_Scheduler(trace, config, run, arrivals)], arrivals, trace)
    run.dispatches.sort(key=lambda dispatch: (dispatch.started_at, dispatch.job.job_id))
    return run


def simulate_llama_swap_round_robin(trace: Trace, config: LlamaSwapConfig, gpu_count: int) -> Run:
    """llama-swap alone on `gpu_count` GPUs, each with the config's sets,
    behind a round-robin balancer."""
    _check_models(trace, config)
    names = tuple(gpu_names(gpu_count))
    run = Run(trace=trace, policy=ROUND_ROBIN_NAME, gpus=names)
    arrivals = Arrivals(trace)
    schedulers = [_Scheduler(trace, config, run, arrivals, gpu=name) for name in names]
    _replay(schedulers, arrivals, trace)
    run.dispatches.sort(key=lambda dispatch: (dispatch.started_at, dispatch.job.job_id))
    return run
