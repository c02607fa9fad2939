"""Two members with jobs in every state (queued in a chain, running, finished
with a stored file, with webhook deliveries), for the fuzzer and the
isolation tests."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from django.core import signals
from django.db import close_old_connections

from queueapp import services
from queueapp.dispatch.claim import ClaimedJob, job_claim_next
from queueapp.dispatch.lease import job_end_durable
from queueapp.models import Job, Member
from queueapp.upstream.client import UpstreamAnswer
from tests import factories
from tests.e2e.conftest import simulator, world  # noqa: F401  (fixtures for the daphne tests)

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 64


@dataclass
class Owner:
    member: Member
    token: str
    jobs: list[Job] = field(default_factory=list)
    chains: list[str] = field(default_factory=list)

    @property
    def job_ids(self) -> list[int]:
        return [job.pk for job in self.jobs]


def _submit(
    owner: Owner,
    *,
    label: str,
    chain: dict | None = None,
    callback: bool = False,
    priority: str = "batch",
) -> Job:
    job = services.job_submit(
        member=owner.member,
        path="/v1/chat/completions",
        body=factories.chat_body(user=label),
        model="chat-small",
        priority_header=priority,
        callback_url=f"https://hooks.example.com/{owner.member.name}" if callback else "",
        chain=chain,
    )
    owner.jobs.append(job)
    if chain:
        owner.chains.append(chain["id"])
    return job


def _run(owner: Owner, *, label: str, answer: UpstreamAnswer | None) -> Job:
    """A job claimed by the dispatcher and, with an answer, finished."""
    job = _submit(owner, label=label, callback=True, priority="interactive")
    claim = job_claim_next(resident_model="chat-small", worker="test")
    assert isinstance(claim, ClaimedJob) and claim.job_id == job.pk, claim
    if answer is not None:
        job_end_durable(claim=claim, answer=answer, error=None, inline_limit=256)
    return job


def _populate(name: str, *, tier: str, running: bool) -> Owner:
    member, token = factories.member(name, tier)
    owner = Owner(member, token)
    _run(
        owner,
        label=f"{name}-secret-json",
        answer=UpstreamAnswer(200, "application/json", b'{"ok": 1}', None),
    )
    _run(owner, label=f"{name}-secret-png", answer=UpstreamAnswer(200, "image/png", PNG, None))
    _run(
        owner,
        label=f"{name}-secret-failed",
        answer=UpstreamAnswer(500, "text/plain", b"boom", None),
    )
    if running:
        _run(owner, label=f"{name}-secret-running", answer=None)
    _submit(owner, label=f"{name}-secret-queued", callback=True)
    _submit(
        owner, label=f"{name}-secret-unit", chain={"id": f"{name}-film", "index": 0, "total": 3}
    )
    cancelled = _submit(owner, label=f"{name}-secret-cancelled", callback=True)
    services.job_cancel(job=cancelled, by=name)
    return owner


@dataclass
class Population:
    ann: Owner
    bob: Owner
    staff_token: str


@pytest.fixture
def population(db, settings, tmp_path) -> Population:
    """ann (pro) and bob (free), each with jobs queued, in a chain, finished
    (JSON, a stored PNG, a failure), cancelled, with webhook deliveries; bob's
    job runs. Names and bodies carry `secret` so a leak is easy to grep."""
    settings.MEDIA_ROOT = tmp_path / "media"
    factories.policy()
    ann = _populate("ann-secret-name", tier="pro", running=False)
    bob = _populate("bob-secret-name", tier="free", running=True)
    _, staff_token = factories.member("op-staff", "max", staff=True)
    return Population(ann=ann, bob=bob, staff_token=staff_token)


@pytest.fixture
def in_process_wsgi() -> Iterator[None]:
    """Requests made to the WSGI handler directly (not through Django's test
    client) would close the test's connection at their end, as a server does."""
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    yield
    signals.request_started.connect(close_old_connections)
    signals.request_finished.connect(close_old_connections)
