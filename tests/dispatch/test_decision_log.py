import json
import logging

import pytest

from queueapp.dispatch.claim import job_claim_next
from tests import factories


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.mark.django_db(transaction=True)
def test_each_dispatch_logs_one_json_line_after_commit(default_tiers):
    handler = Lines()
    logger = logging.getLogger("gpusched.decisions")
    logger.addHandler(handler)
    try:
        ann, _ = factories.member("ann", "pro")
        job = factories.job(ann, priority="batch", model="m")
        job_claim_next(resident_model="m", worker="test")
    finally:
        logger.removeHandler(handler)
    [line] = handler.messages
    entry = json.loads(line)
    assert entry["event"] == "dispatch" and entry["job"] == job.pk
    assert entry["band"] == -100 and entry["terms"]["tier_bonus"] == 1
    assert entry["swap_needed"] is False and entry["changed_by"] == []
