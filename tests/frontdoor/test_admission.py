"""A front-door call's job is queued and, in the same commit, claimed for its
caller when the GPU is idle and the score picks it; a relayed job's end
claims for the next caller in the same commit too. These are the claim the
dispatcher makes (the same decision row, events and lease), checked here
against real PostgreSQL."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from queueapp.dispatch import wakeup
from queueapp.dispatch.claim import ClaimedJob, job_claim_next
from queueapp.dispatch.lease import job_end_and_grant
from queueapp.dispatch.outcomes import ClaimRecord
from queueapp.frontdoor.admission import job_submit_and_claim
from queueapp.models import DispatchDecision, Job, JobEvent, JobStatus
from queueapp.upstream.client import UpstreamAnswer
from tests import factories
from tests.frontdoor.conftest import GATEWAY

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.database_server]

WORKER = "frontdoor@test"
ANSWER = UpstreamAnswer(200, "application/json", b'{"choices": []}', None)


def admit(owner, *, priority: str | None = None, claim: bool = True):
    return job_submit_and_claim(
        gateway=GATEWAY,
        worker=WORKER,
        claim=claim,
        member=owner,
        path="/v1/chat/completions",
        body=factories.chat_body("chat-small"),
        model="chat-small",
        priority_header=priority,
    )


def events(job: Job) -> list[str]:
    return list(JobEvent.objects.filter(job=job).order_by("id").values_list("kind", flat=True))


def test_an_idle_gpu_is_granted_in_the_submissions_commit(default_tiers, gateway_session):
    ann, _ = factories.member("ann", "pro")
    job, claim = admit(ann, priority="interactive")

    assert isinstance(claim, ClaimedJob) and claim.job_id == job.pk and claim.granted
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING and job.lease_owner == claim.claim_token
    assert job.lease_expires_at is not None and job.score_at_dispatch is not None
    assert events(job) == [JobEvent.Kind.SUBMITTED, JobEvent.Kind.STARTED]
    decision = DispatchDecision.objects.get(job=job)
    assert decision.terms["effective"] == pytest.approx(claim.effective_score)


def test_the_grant_records_what_a_dispatcher_claim_records(default_tiers, gateway_session):
    ann, _ = factories.member("ann", "pro")
    granted, _ = admit(ann)
    job_end_and_grant(
        claim=ClaimRecord.of_row(Job.objects.get(pk=granted.pk)),
        answer=ANSWER,
        error=None,
        inline_limit=10_000,
        gateway=None,
        worker=WORKER,
    )
    rest = factories.job(ann, model="chat-small")
    assert isinstance(job_claim_next(resident_model=None, worker="dispatcher"), ClaimedJob)

    by_gateway, by_dispatcher = (DispatchDecision.objects.get(job=j) for j in (granted, rest))
    for field in ("terms", "policy", "counterfactuals"):
        assert set(getattr(by_gateway, field)) == set(getattr(by_dispatcher, field)), field
    assert set(by_gateway.candidates[0]) == set(by_dispatcher.candidates[0])
    assert events(granted)[:2] == events(rest)[:2]


def test_a_better_job_waiting_elsewhere_is_not_jumped(default_tiers, gateway_session):
    ann, _ = factories.member("ann", "pro")
    bob, _ = factories.member("bob", "pro")
    better = factories.job(bob, priority="interactive")  # waits for the dispatcher
    job, claim = admit(ann, priority="batch")

    assert claim is None
    assert Job.objects.get(pk=job.pk).status == JobStatus.QUEUED
    assert not DispatchDecision.objects.exists()
    first = job_claim_next(resident_model=None, worker="dispatcher")
    assert isinstance(first, ClaimedJob) and first.job_id == better.pk


def test_a_busy_gpu_or_claim_false_only_queues(default_tiers, gateway_session):
    ann, _ = factories.member("ann", "pro")
    running, claim = admit(ann)
    assert claim is not None
    waiting, busy = admit(ann)
    told_busy, not_tried = admit(ann, claim=False)
    assert busy is None and not_tried is None
    assert Job.objects.get(pk=waiting.pk).status == JobStatus.QUEUED
    assert Job.objects.get(pk=told_busy.pk).status == JobStatus.QUEUED


def test_an_end_grants_the_next_caller_of_its_gateway_in_the_same_commit(
    default_tiers, gateway_session
):
    ann, _ = factories.member("ann", "pro")
    first, claim = admit(ann)
    second, _ = admit(ann)
    assert claim is not None

    following = job_end_and_grant(
        claim=claim,
        answer=ANSWER,
        error=None,
        inline_limit=10_000,
        gateway=GATEWAY,
        worker=WORKER,
    )
    assert isinstance(following, ClaimedJob) and following.job_id == second.pk
    first.refresh_from_db()
    assert first.status == JobStatus.SUCCEEDED and first.result_body == {"choices": []}
    assert events(first)[-1] == JobEvent.Kind.SUCCEEDED
    assert Job.objects.get(pk=second.pk).status == JobStatus.RUNNING


def test_an_end_without_waiting_callers_leaves_the_claim_to_the_dispatcher(
    default_tiers, gateway_session
):
    ann, _ = factories.member("ann", "pro")
    _, claim = admit(ann)
    second, _ = admit(ann)
    assert claim is not None
    following = job_end_and_grant(
        claim=claim, answer=ANSWER, error=None, inline_limit=10_000, gateway=None, worker=WORKER
    )
    assert following is None
    assert Job.objects.get(pk=second.pk).status == JobStatus.QUEUED


def test_an_end_after_the_lease_was_lost_changes_nothing(default_tiers, gateway_session):
    ann, _ = factories.member("ann", "pro")
    job, claim = admit(ann)
    assert claim is not None
    Job.objects.filter(pk=job.pk).update(lease_owner="someone-else")
    job_end_and_grant(
        claim=claim, answer=ANSWER, error=None, inline_limit=10_000, gateway=None, worker=WORKER
    )
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING and job.result_body is None
    assert JobEvent.Kind.SUCCEEDED not in events(job)


def test_an_answer_too_large_to_keep_inline_goes_to_a_file(default_tiers, gateway_session):
    ann, _ = factories.member("ann", "pro")
    job, claim = admit(ann)
    assert claim is not None
    job_end_and_grant(
        claim=claim, answer=ANSWER, error=None, inline_limit=4, gateway=None, worker=WORKER
    )
    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED and job.result_body is None
    assert job.result_file.read() == ANSWER.content


def test_the_admission_is_one_statement_per_step(default_tiers, gateway_session, settings):
    settings.REDIS_URL = ""  # the dashboard's notices are then in the statements
    ann, _ = factories.member("ann", "pro")
    with CaptureQueriesContext(connection) as captured:
        admit(ann)
    steps = [
        "synchronous_commit TO OFF",  # its commit waits for no flush (prepared.py)
        "FOR SHARE OF tier",  # the clock, the queue's state, the tier, the member's lines
        "max(submitted_at)",  # the member's queued count and line, its latest job
        'INSERT INTO "queueapp_job"',  # the job
        "INSERT INTO queueapp_jobevent",  # its event and the dashboard's notice
        "AS claiming",  # the GPUs: which have room for its model is decided in Python
        "pg_try_advisory_xact_lock",  # the claim: that GPU's claim lock, tried
        "LEFT JOIN LATERAL",  # the GPU's state
        "ORDER BY rank_key DESC",  # the candidates
        "SKIP LOCKED",  # the winner locked and marked running
        # its lane moved on, the decision, its event, the notice
        "INSERT INTO queueapp_dispatchdecision",
    ]
    statements = [query["sql"] for query in captured.captured_queries]
    # After the COMMIT: the once-a-second request for a dispatch pass (wakeup.py).
    body = [sql for sql in statements[: statements.index("COMMIT")] if sql != "BEGIN"]
    assert len(body) == len(steps), "\n".join(" ".join(sql.split())[:90] for sql in body)
    for sql, step in zip(body, steps, strict=True):
        assert step in sql, (step, sql)
    assert "pg_advisory_xact_lock" in body[1]
    assert "INSERT INTO queueapp_lane" in body[-1]


def test_the_claims_statements_are_prepared_on_the_connection(
    default_tiers, gateway_session, monkeypatch
):
    # The commit's request for a dispatch pass (at most once a second) goes
    # through django-q2's broker, which recycles the thread's connection.
    monkeypatch.setattr(wakeup, "_kick_now_and_then", lambda: None)
    ann, _ = factories.member("ann", "pro")
    admit(ann)
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        prepared = [row[0] for row in cursor.fetchall()]
    assert any("SKIP LOCKED" in statement for statement in prepared), prepared
    assert any("FOR SHARE OF tier" in statement for statement in prepared), prepared
