"""A grant's notice that reaches the gateway after its call stopped waiting
for it: the relay under way, or the job's end being written. Seen with 300
callers at once on a busy machine: the notice was taken for a grant nobody
waited for, and the job abandoned as "the caller left" under its end."""

import asyncio

import pytest

from queueapp.frontdoor import gateway as gateway_module
from queueapp.frontdoor.gateway import Gateway, Grant
from queueapp.models import JobStatus

pytestmark = pytest.mark.asyncio


@pytest.fixture
def abandoned(monkeypatch) -> list[tuple[int, str]]:
    """The jobs the gateway abandons, recorded instead of ended, in the event
    loop's thread rather than the database's: a task's turn runs it."""
    calls: list[tuple[int, str]] = []

    def at_once(function, **_):
        async def call(*args):
            return function(*args)

        return call

    monkeypatch.setattr(gateway_module, "db", at_once)
    monkeypatch.setattr(
        gateway_module, "abandon", lambda job_id, reason: calls.append((job_id, reason))
    )
    return calls


async def settled(before: set[asyncio.Task]) -> None:
    """Every task started since `before` (what the gateway began) has ended."""
    started = asyncio.all_tasks() - before - {asyncio.current_task()}
    await asyncio.wait_for(asyncio.gather(*started), timeout=5)


async def test_a_late_notice_of_a_relayed_grant_leaves_the_job_alone(abandoned):
    gateway = Gateway()
    gateway.held.add(7)  # its call relays it; the call no longer waits
    before = asyncio.all_tasks()
    gateway._deliver(7, Grant(JobStatus.RUNNING))
    await settled(before)
    assert abandoned == [] and gateway._early == {}


async def test_a_late_notice_while_the_end_is_written_leaves_the_job_alone(abandoned):
    gateway = Gateway()
    ending = asyncio.Event()
    gateway._finishing[7] = asyncio.ensure_future(ending.wait())
    before = asyncio.all_tasks()
    gateway._deliver(7, Grant(JobStatus.RUNNING))
    await settled(before)
    ending.set()
    assert abandoned == [] and gateway._early == {}


async def test_a_grant_nobody_here_waits_for_is_freed_at_once(abandoned):
    """The rule the two above narrow: a caller that left frees the GPU."""
    gateway = Gateway()
    before = asyncio.all_tasks()
    gateway._deliver(7, Grant(JobStatus.RUNNING))
    await settled(before)
    assert abandoned == [(7, "the caller left as the GPU was granted")]
