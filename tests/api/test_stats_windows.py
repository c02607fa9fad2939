"""Per-band figures over the last hour, the last day, and all time."""

from datetime import timedelta

import pytest

from queueapp.selectors import db_now
from tests import factories

pytestmark = pytest.mark.django_db


def test_each_window_counts_only_its_own_dispatches(api, default_tiers):
    member, token = factories.member("ann", "free")
    batch = factories.job(member, priority="batch")
    normal = factories.job(member)
    factories.decision(batch, at=db_now() - timedelta(hours=0.5), changed_by_fairness=True)
    factories.decision(batch, at=db_now() - timedelta(hours=2), changed_by_aging=True)
    factories.decision(batch, at=db_now() - timedelta(hours=2), changed_by_tier_bonus=True)
    factories.decision(normal, at=db_now() - timedelta(hours=48), changed_by_swap_affinity=True)

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
