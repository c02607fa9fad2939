"""Front-door calls of a model with parallel slots are granted side by side:
at admission while the GPU has a free slot of their model, never beyond."""

from __future__ import annotations

import pytest

from queueapp import services
from queueapp.dispatch.claim import ClaimedJob
from queueapp.frontdoor.admission import job_submit_and_claim
from queueapp.models import Job, JobStatus
from tests import factories
from tests.frontdoor.conftest import GATEWAY

pytestmark = pytest.mark.django_db(transaction=True)


def admit(owner, model: str = "chat-small"):
    return job_submit_and_claim(
        gateway=GATEWAY,
        worker="frontdoor@test",
        member=owner,
        path="/v1/chat/completions",
        body=factories.chat_body(model),
        model=model,
        priority_header=None,
    )


def test_calls_are_granted_free_slots_of_their_model_at_admission(default_tiers, gateway_session):
    services.model_parallel_set(name="chat-small", parallel=2)
    members = [factories.member(name, "pro")[0] for name in ("ann", "bob", "cy")]
    admitted = [admit(member) for member in members]
    granted = [claim for _, claim in admitted]
    assert isinstance(granted[0], ClaimedJob) and isinstance(granted[1], ClaimedJob)
    assert (granted[0].gpu_slot, granted[1].gpu_slot) == (0, 1)
    assert granted[2] is None  # both slots are taken
    running = Job.objects.filter(status=JobStatus.RUNNING).order_by("gpu_slot")
    assert [job.pk for job in running] == [admitted[0][0].pk, admitted[1][0].pk]


def test_a_call_of_another_model_is_not_granted_while_slots_are_in_flight(
    default_tiers, gateway_session
):
    services.model_parallel_set(name="chat-small", parallel=4)
    ann, _ = factories.member("ann", "pro")
    _, first = admit(ann)
    assert isinstance(first, ClaimedJob)
    image, claim = admit(ann, model="image-sd")
    assert claim is None and Job.objects.get(pk=image.pk).status == JobStatus.QUEUED
