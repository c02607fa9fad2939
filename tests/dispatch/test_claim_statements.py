"""The claim sits between two GPU jobs: each of its steps is one statement."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from queueapp import services
from queueapp.dispatch.claim import ClaimedJob, job_claim_next
from tests import factories

pytestmark = pytest.mark.database_server


def _claim_statements() -> list[str]:
    gpu = services.gpu_register(name="gpu0", url="http://127.0.0.1:9")
    with CaptureQueriesContext(connection) as captured:
        claim = job_claim_next(resident_model="m", worker="test", gpu=gpu.pk)
    assert isinstance(claim, ClaimedJob)
    return [query["sql"] for query in captured.captured_queries]


@pytest.mark.django_db(transaction=True)
def test_a_claim_is_one_statement_per_step(default_tiers, settings):
    settings.REDIS_URL = ""  # the dashboard's notice is then in the SQL
    ann, _ = factories.member("ann", "pro")
    factories.job(ann, priority="batch", model="m")
    statements = _claim_statements()
    steps = [
        "pg_advisory_xact_lock",  # the GPU's claim lock
        "LEFT JOIN LATERAL",  # the GPU's state
        "ORDER BY rank_key DESC",  # the candidates
        "SKIP LOCKED",  # the winner locked and marked running
        # its lane moved on, the decision, its event, and
        "INSERT INTO queueapp_dispatchdecision",
    ]
    # ... the dashboard's notice, in that same statement.
    body = [sql for sql in statements if sql not in ("BEGIN", "COMMIT")]
    assert len(body) == len(steps), body
    for sql, step in zip(body, steps, strict=True):
        assert step in sql, (step, sql)
    assert "pg_notify" in body[-1] and "INSERT INTO queueapp_lane" in body[-1]
