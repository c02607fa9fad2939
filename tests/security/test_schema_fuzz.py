"""Schemathesis against /api/schema/: every operation, valid and invalid
inputs, no 5xx, every answer as the schema documents it (status code, content
type, body, headers), and a refused anonymous call (401) where a token is
required.

`make test` runs GPUSCHED_FUZZ_EXAMPLES (default 20) generated cases per
operation and phase; `make fuzz` runs 1000.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import schemathesis
from django.core.exceptions import ValidationError
from django.core.validators import URLValidator
from django.core.wsgi import get_wsgi_application
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import positive_data_acceptance

from queueapp.webhooks.ssrf import RefusedAddress, check_literal
from tests.security.conftest import Population

EXAMPLES = int(os.environ.get("GPUSCHED_FUZZ_EXAMPLES", "20"))

# The schema view needs no database, so it loads at collection time and each
# operation becomes its own test.
schema = schemathesis.openapi.from_wsgi("/api/schema/", get_wsgi_application())
# The token goes in every call below; generated Authorization headers would
# only stand for it (the `ignored_auth` check still calls without one).
# NUL in a string is refused with a 400 (PostgreSQL cannot store it; see
# queueapp/job_body.py and tests/security/test_malformed_input.py), a rule
# JSON Schema has no word for; so the fuzzer leaves NUL out of valid data.
schema.config.generation.update(with_security_parameters=False, allow_x00=False)

# Ids of the calling member's own jobs and chains, set per test: half of the
# generated ids are swapped for one of them, so the fuzzer reaches real
# objects (and their 200 answers) as well as ids that do not exist.
OWN: dict[str, list] = {"job_id": [], "chain_id": []}


@schema.hook
def map_path_parameters(context, path_parameters):  # type: ignore[no-untyped-def]
    if not path_parameters:
        return path_parameters
    job_id, chain_id = path_parameters.get("job_id"), path_parameters.get("chain_id")
    # Only values of the documented type are swapped: an invalid one (a
    # negative case) stays invalid.
    if OWN["job_id"] and type(job_id) is int and job_id % 2 == 0:
        path_parameters["job_id"] = OWN["job_id"][job_id // 2 % len(OWN["job_id"])]
    if OWN["chain_id"] and type(chain_id) is str and len(chain_id) % 2 == 0:
        path_parameters["chain_id"] = OWN["chain_id"][len(chain_id) // 2 % len(OWN["chain_id"])]
    return path_parameters


def _valid_beyond_json_schema(body: object) -> bool:
    """What JSON Schema cannot state about a job submission: `chain.index <
    chain.total` (two fields), a callback URL Django accepts (host name
    length and labels) whose host is not a private address, and a preload's
    `gpu` naming a GPU that runs its model. Failing these is a documented 400
    naming the field (tests/api/test_jobs.py, tests/api/test_preload.py)."""
    if not isinstance(body, dict):
        return True
    if "gpu" in body:
        return False
    chain = body.get("chain")
    if isinstance(chain, dict) and type(chain.get("index")) is type(chain.get("total")) is int:
        if chain["index"] >= chain["total"]:
            return False
    url = body.get("callback_url")
    if isinstance(url, str) and url:
        try:
            URLValidator()(url)
            check_literal(url)
        except (ValidationError, RefusedAddress):
            return False
    return True


@pytest.fixture
def caller(population: Population, in_process_wsgi, settings) -> Iterator[Population]:
    # The fuzzer's own refused calls (its anonymous and bad-token probes) must
    # not trip the failed-login limit, which tests/security/test_auth_hardening.py
    # covers; every other answer, 429 included, is checked against the schema.
    settings.GPUSCHED_AUTH_FAILURES_PER_MINUTE = 0
    OWN["job_id"] = population.ann.job_ids
    OWN["chain_id"] = population.ann.chains
    yield population
    OWN["job_id"], OWN["chain_id"] = [], []


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
def test_every_operation_answers_as_documented_and_never_5xx(case, caller):
    staff_only = case.method == "PATCH"  # PATCH /api/policy/
    token = caller.staff_token if staff_only else caller.ann.token
    excluded = []
    if staff_only:
        # The policy's band-spacing invariant spans the stored tiers and the
        # other policy fields (DESIGN.md: band spacing > largest tier bonus +
        # affinity bonus), which JSON Schema cannot state; such a refusal is a
        # documented 400 and its shape is still checked.
        excluded.append(positive_data_acceptance)
    if case.method == "POST" and not _valid_beyond_json_schema(case.body):
        excluded.append(positive_data_acceptance)
    if "as_of" in (case.query or {}):
        # `why`'s as_of must lie inside a queued job's wait so far, which JSON
        # Schema cannot state; other instants are a documented 400 naming it
        # (tests/api/test_why_as_of.py), whose shape is still checked.
        excluded.append(positive_data_acceptance)
    if case.method == "POST" and "X-Gpusched-Max-Wait" in (case.headers or {}):
        # A bound the forecast cannot meet is refused by design with the
        # documented 503 gpu_busy (and its Retry-After); its shape is checked.
        excluded.append(not_a_server_error)
    case.call_and_validate(headers={"Authorization": f"Bearer {token}"}, excluded_checks=excluded)


# Inputs the fuzzer found once, tried on every run whatever it generates:
# (method, path, body, the status it must get).
PINNED = [
    pytest.param(
        "POST",
        "/api/preload/",
        # `make fuzz` at 300 examples: a 40-character non-ASCII name, percent-
        # encoded into the preload's path, overflowed the job's column (a 500).
        # The path now keeps the name as given (upstream.client.preload_path).
        {"model": "\u00fc\u4e2d\U0001f916" * 14},
        201,
        id="preload with a non-ASCII model",
    ),
    pytest.param(
        "POST", "/api/preload/", {"model": "\U0001f916" * 200}, 201, id="preload, longest model"
    ),
    pytest.param(
        "POST",
        "/api/jobs/",
        {"path": "/v1/chat/completions", "body": {"model": "m" * 300, "messages": []}},
        400,
        id="job with a 300-character model",
    ),
    pytest.param(
        # `make fuzz` at 1,000 examples: `false` was read as 0 seconds.
        "PATCH",
        "/api/policy/",
        {"borrow_max_seconds": False, "borrow_keep_idle_gpus": 0},
        400,
        id="policy with a boolean for a number",
    ),
]


@pytest.mark.parametrize(("method", "path", "body", "status"), PINNED)
def test_pinned_inputs_answer_as_documented_and_never_5xx(caller, method, path, body, status):
    token = caller.staff_token if method == "PATCH" else caller.ann.token
    case = schema[path][method].Case(body=body, media_type="application/json")
    response = case.call_and_validate(headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == status, response.text
