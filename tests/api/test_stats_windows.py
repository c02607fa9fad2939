"""Per-band figures over the last hour, the last day, and all time."""

from datetime import timedelta

import pytest

from queueapp.models import DispatchDecision
from queueapp.selectors import db_now
from tests import factories

pytestmark = pytest.mark.django_db


def decision(job, *, hours_ago: float, **changed: bool) -> None:
    DispatchDecision.objects.create(
        at=db_now() - timedelta(hours=hours_ago),
        job=job,
        band=job.priority,
        terms={},
        candidates=[],
        policy={},
        swap_needed=False,
        counterfactuals={},
        **{f"changed_by_{term}": flag for term, flag in changed.items()},
    )


def test_each_window_counts_only_its_own_dispatches(api, default_tiers):
    member, token = factories.member("ann", "free")
    batch = factories.job(member, priority="batch")
    normal = factories.job(member)
    decision(batch, hours_ago=0.5, fairness=True)
    decision(batch, hours_ago=2, aging=True)
    decision(batch, hours_ago=2, tier_bonus=True)
    decision(normal, hours_ago=48, swap_affinity=True)

    def band(window, number):
        answer = api.as_member(token).get(f"/api/stats/?window={window}").json()
        assert answer["window"] == window
        return next(row for row in answer["bands"] if row["band"] == number)

    expected = {
        "hour": (1, {"fairness": 1, "aging": 0, "tier_bonus": 0}, 0),
        "day": (3, {"fairness": 1, "aging": 1, "tier_bonus": 1}, 0),
        "all": (3, {"fairness": 1, "aging": 1, "tier_bonus": 1}, 1),
    }
    for window, (batch_count, batch_changes, normal_count) in expected.items():
        figures = band(window, -100)
        assert figures["dispatched"] == batch_count, window
        assert {term: figures["order_changed_by"][term] for term in batch_changes} == (
            batch_changes
        ), window
        assert band(window, 0)["dispatched"] == normal_count, window
        # Depth and longest wait are now, whatever the window.
        assert figures["queued"] == 1 and figures["longest_wait_seconds"] >= 0
    assert band("all", 0)["order_changed_by"]["swap_affinity"] == 1
