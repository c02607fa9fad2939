"""Which sweeps a pass runs where, and on which clock (the sweeps stubbed)."""

from __future__ import annotations

import pytest

from queueapp import services
from queueapp.dispatch import housekeeping
from queueapp.dispatch.housekeeping import Housekeeping, Moment


@pytest.fixture
def swept(monkeypatch) -> list[str]:
    """The name of each sweep run, in order."""
    ran: list[str] = []
    for module, name in [
        (housekeeping, "jobs_recover_expired"),
        (services, "front_door_orphans_cancel"),
        (services, "jobs_expire_overdue"),
        (services, "jobs_report_running_long"),
    ]:
        monkeypatch.setattr(module, name, lambda name=name: ran.append(name))
    return ran


def test_between_jobs_recovery_callers_and_the_watchdog_run_each_on_its_clock(swept):
    sweeps = Housekeeping()
    sweeps.sweep(Moment.BETWEEN_JOBS)
    sweeps.sweep(Moment.BETWEEN_JOBS)  # at once: no clock is due again
    assert swept == [
        "jobs_recover_expired",
        "front_door_orphans_cancel",
        "jobs_report_running_long",
    ]
    sweeps.recovery.now()
    sweeps.sweep(Moment.BETWEEN_JOBS)
    assert swept[3:] == ["jobs_recover_expired"]


def test_a_waiting_pass_sweeps_callers_and_overdue_jobs_at_every_wake(swept):
    sweeps = Housekeeping()
    sweeps.sweep(Moment.WAITING)
    sweeps.sweep(Moment.WAITING)
    assert swept == [
        "front_door_orphans_cancel",
        "jobs_expire_overdue",
        "jobs_report_running_long",
        "front_door_orphans_cancel",
        "jobs_expire_overdue",
    ]


def test_beside_shared_slots_only_the_watchdog_runs(swept):
    Housekeeping().sweep(Moment.BESIDE_SLOTS)
    assert swept == ["jobs_report_running_long"]


def test_the_config_file_is_looked_at_on_its_clock_between_jobs_and_idle_never_beside_slots(
    swept,
):
    sweeps = Housekeeping(routing_check=lambda: swept.append("routing_check"))
    sweeps.sweep(Moment.BESIDE_SLOTS)
    sweeps.sweep(Moment.BETWEEN_JOBS)
    sweeps.sweep(Moment.WAITING)  # at once: not due again
    assert swept.count("routing_check") == 1 and swept.index("routing_check") == 1
    sweeps.routing_check.now()
    sweeps.sweep(Moment.WAITING)
    assert swept.count("routing_check") == 2
