"""The policy simulator dispatches a trace in the same order as the live system.

`fixtures/traces/live-check.jsonl` (14 chat jobs of a free, a pro and a max
member, three bands, two models) runs twice: through `manage.py simulate`'s
engine with the `gpusched` policy, and through the real system (PostgreSQL,
the django-q2 GPU cluster process, the llama-swap simulator over HTTP). The
order the llama-swap simulator received the jobs must equal the simulated
order, and each dispatch must agree on whether it swapped and on which terms
changed the order (the decision row's `changed_by_*`).

Why the live run is deterministic:
- Every job is submitted while dispatch is paused (the Policy row), then
  dispatch is released once: all jobs are queued at the first decision, as
  the trace's `dispatch_from` says, whatever the submission took.
- Aging cannot reorder anything on wall-clock jitter: the whole live run
  takes a few seconds, which is a few hundredths of a point at 60 s per
  point, while every two members differ by a whole tier point and affinity
  is worth 10. Aging only breaks ties inside one member's band, where what
  counts is the order of events (submissions, then dispatches, which reset
  the lane clock) and not their exact times; that order is the same in both.
- Durations (0.05 s jobs, a 0.1 s swap) only set the pace; both runs
  charge a swap on every model change and the GPU never idles between jobs.

The order is checked to differ from FIFO's and from strict priority's, so
the comparison exercises the tier bonus, swap affinity and the lane clock.
"""

import pytest

from gpusched.stack import wait_for
from queueapp.models import Job, JobStatus
from queueapp.policy import TERMS
from queueapp.simulation.baselines import compare
from queueapp.simulation.traces import TRACES_DIR, load_trace
from tests import factories
from tests.e2e.helpers import submit_trace

pytestmark = [pytest.mark.e2e]

TRACE = TRACES_DIR / "live-check.jsonl"


def test_simulated_order_equals_the_live_order(world):
    trace = load_trace(TRACE)
    # The simulated world is the live one: same swap cost, same tiers.
    assert trace.swap_seconds == world.simulator.swap_seconds
    assert trace.tier_bonuses() == {name: float(b) for name, b in factories.TIER_DEFAULTS.items()}
    assert trace.initial_model is None and world.simulator.running() == {"running": []}
    fifo, strict, simulated = compare(trace, ["fifo", "strict-priority", "gpusched"])
    assert simulated.order != fifo.order
    assert simulated.order != strict.order

    members = {name: factories.member(name, tier)[0] for name, tier in trace.members.items()}
    factories.policy(dispatch_paused=True)
    world.start_cluster()
    submit_trace(trace, members)
    assert not world.simulator.log(), "nothing may start while dispatch is paused"
    factories.policy(dispatch_paused=False)
    wait_for(
        lambda: (
            len(world.served()) == len(trace.jobs)
            and not Job.objects.filter(status__in=[JobStatus.QUEUED, JobStatus.RUNNING]).exists()
        ),
        message=f"{len(trace.jobs)} jobs served",
    )

    assert world.served_labels() == simulated.order
    live = []
    for label in world.served_labels():
        decision = Job.objects.get(body__user=label).decisions.get()
        changed = {term for term in TERMS if getattr(decision, f"changed_by_{term}")}
        live.append((label, decision.swap_needed, changed))
    assert live == [
        (dispatch.job.job.id, dispatch.swapped, set(dispatch.changed_by))
        for dispatch in simulated.dispatches
    ]
