import json
import logging
import os
import subprocess
import sys

import pytest

from queueapp.dispatch.claim import job_claim_next
from queueapp.models import DispatchDecision
from queueapp.policy import TERMS
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


@pytest.mark.e2e  # starts a process
def test_the_configured_decision_log_file_holds_bare_json_lines(tmp_path):
    """Through the project's own logging settings, in a fresh process."""
    target = tmp_path / "decisions.jsonl"
    script = (
        "import django, logging; django.setup(); "
        "log = logging.getLogger('gpusched.decisions'); "
        'log.info(\'{"event": "dispatch", "job": 1}\'); log.info(\'{"job": 2}\')'
    )
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "gpusched.settings"}
    env["GPUSCHED_DECISION_LOG"] = str(target)
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=60)
    lines = target.read_text().splitlines()
    assert [json.loads(line) for line in lines] == [{"event": "dispatch", "job": 1}, {"job": 2}]


def test_every_term_has_its_changed_by_column():
    # The decision's statement writes `changed_by_<term>` for each term of
    # the policy: a term renamed on one side fails here, not in a claim.
    columns = {field.name for field in DispatchDecision._meta.get_fields()}
    assert {f"changed_by_{term}" for term in TERMS} <= columns
