"""A pass's heartbeats: the leases of the jobs it forwards, kept while their
calls run, with the sweeps the pass cannot run meanwhile.

Each is a `LeaseKeeper` (queueapp/dispatch/lease_keeper.py) on a thread and
a database connection of its own, with a `Housekeeping` of its own
(queueapp/dispatch/housekeeping.py) beside it:

- `heartbeat`: the job the pass forwards itself. The pass does not tick
  while it waits on that call, so its waiting sweeps (callers gone, overdue
  jobs, the holder watchdog) run here every CALLER_CHECK_SECONDS.
- `slots_heartbeat`: every job in flight in the pass's shared slots at once
  (queueapp/dispatch/shared_slots.py), on one connection, so a slot costs a
  database connection only while its end is written. The pass goes on
  ticking meanwhile, so only the watchdog runs beside, on its clock.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from queueapp.dispatch.housekeeping import CALLER_CHECK_SECONDS, Housekeeping, Moment
from queueapp.dispatch.lease_keeper import LeaseKeeper
from queueapp.dispatch.outcomes import ClaimedJob


def heartbeat(claim: ClaimedJob) -> LeaseKeeper:
    """The lease of the job the pass forwards itself, with its waiting sweeps."""
    sweeps = Housekeeping()
    return LeaseKeeper.of(
        claim, beside=lambda: sweeps.sweep(Moment.WAITING), wake_every=CALLER_CHECK_SECONDS
    )


def slots_heartbeat(held: Callable[[], Sequence[ClaimedJob]]) -> LeaseKeeper:
    """The leases of the jobs in flight in shared slots, with the watchdog."""
    sweeps = Housekeeping()
    return LeaseKeeper(held, name="slot-leases", beside=lambda: sweeps.sweep(Moment.BESIDE_SLOTS))
