"""A dispatcher's housekeeping: every sweep it runs on a clock, in one place.

Nothing asks for these sweeps; they keep the queue true while the pass does
its work: recovery of expired leases (a dispatcher died), front-door
callers whose web process died (queued jobs cancelled, a granted job's
process checked), queued jobs past their wait bound, and the holder
watchdog (queueapp/services/running_long.py). `Housekeeping.sweep` runs
those due where the pass is (`Moment`):

- Between two jobs (`Dispatcher.tick`): recovery, callers gone and the
  watchdog, each on its own `Every` clock. Expired leases only exist after
  a dispatcher died, so recovery runs at the start of a pass and now and
  then, not per job. Not the wait-bound sweep: there `decide` keeps an
  overdue head off the GPU, and a claim that finds only overdue heads
  expires them (`HeadsOverdue`).
- Waiting: idle on the work channel, or on the call of the job the pass
  forwards itself (on its heartbeat's thread; the pass does not tick
  then). Callers gone and overdue jobs at every wake (the wait is their
  clock), the watchdog on its clock: a job runs long while a GPU is busy,
  and the busy GPU may be another dispatcher's or a web process's.
- Beside shared slots (their lease thread): the watchdog alone; the pass
  goes on ticking meanwhile.
- The pass's own clocks only (between jobs and idle): llama-swap's config
  file, looked at for a change (queueapp/dispatch/routing_file.py).

Each thread that sweeps has clocks of its own (a `Housekeeping` each), so
one never delays another's.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from enum import Enum

from queueapp import services
from queueapp.dispatch.lease import jobs_recover_expired
from queueapp.dispatch.routing_file import ROUTING_CHECK_SECONDS
from queueapp.services.running_long import RUNNING_LONG_CHECK_SECONDS

RECOVERY_INTERVAL_SECONDS = 5.0
# How often queued front-door jobs are checked for a caller whose web process
# died, and a granted one's process for being alive: a dead web process costs
# the GPU at most about this long (plus the claim).
CALLER_CHECK_SECONDS = 0.5


class Every:
    """An action run at most every `seconds` (time.monotonic), on the call
    that finds it due: the pass's housekeeping clocks."""

    def __init__(self, seconds: float, action: Callable[[], object] | None = None) -> None:
        self.seconds = seconds
        self.action = action
        self._last = -math.inf

    def __call__(self) -> None:
        if self.action is not None and self.due():
            self.action()
            self._last = time.monotonic()

    def due(self) -> bool:
        return time.monotonic() - self._last >= self.seconds

    def done(self) -> None:
        """Ran now, by its caller."""
        self._last = time.monotonic()

    def now(self) -> None:
        """Due at the next tick."""
        self._last = -math.inf


class Moment(Enum):
    """Where a pass is when it sweeps, which says which sweeps run."""

    BETWEEN_JOBS = "between jobs"
    WAITING = "waiting"
    BESIDE_SLOTS = "beside shared slots"


class Housekeeping:
    """The sweeps of one thread of a pass, with their clocks."""

    def __init__(self, routing_check: Callable[[], object] | None = None) -> None:
        self.recovery = Every(RECOVERY_INTERVAL_SECONDS, jobs_recover_expired)
        self.caller_check = Every(CALLER_CHECK_SECONDS, services.front_door_orphans_cancel)
        self.running_long = Every(RUNNING_LONG_CHECK_SECONDS, services.jobs_report_running_long)
        self.routing_check = Every(ROUTING_CHECK_SECONDS, routing_check)

    def sweep(self, moment: Moment) -> None:
        """Run the sweeps `moment` calls for, those on a clock when due."""
        if moment is not Moment.BESIDE_SLOTS:
            self.routing_check()
        if moment is Moment.BETWEEN_JOBS:
            self.recovery()
            self.caller_check()
        elif moment is Moment.WAITING:
            services.front_door_orphans_cancel()
            services.jobs_expire_overdue()
        self.running_long()
