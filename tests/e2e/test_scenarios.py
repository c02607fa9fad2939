"""DESIGN.md's scenarios, shown by the order in which jobs were dispatched,
on one GPU and on two GPUs that both serve every model.

Real PostgreSQL, the real django-q2 cluster processes, the simulators over
HTTP. Jobs are queued while dispatch is paused, then released at once, so
the order observed is the policy's, not the order of submission. On one GPU
the order is the simulator's own log; on two, where jobs run side by side,
it is the order of the dispatch decisions, and every job is in a
simulator's log once. On two GPUs every tier's running limit (1) is strict
(no GPU lent past it), so one member's jobs run one at a time as on one.

The cases share one running system for each number of GPUs (simulators and
their dispatchers), each with rows of its own: `transactional_db` empties
the tables after a case. Only cases whose second run proves something the
first does not run on two GPUs (docs/operations/tests.md).
"""

from collections.abc import Iterator

import pytest

from gpusched.stack import wait_for
from queueapp.models import Job, JobStatus
from queueapp.selectors import db_now
from tests import factories
from tests.e2e.helpers import Scenario, case_on, make_resident, release_and_wait, shared_system

pytestmark = [pytest.mark.e2e]

# For a case that proves the same on one GPU and on two: the order is
# decided before any GPU is chosen (the priority's mapping at submission).
ONE_GPU = pytest.mark.parametrize("system", [1], ids=["one-gpu"], indirect=True)


@pytest.fixture(scope="module", params=[1, 2], ids=["one-gpu", "two-gpus"])
def system(request, django_db_setup, django_db_blocker, tmp_path_factory) -> Iterator[Scenario]:
    """One GPU, or two that both serve every model, each with its dispatcher."""
    with shared_system(tmp_path_factory, django_db_blocker, gpus=request.param) as running:
        yield running


@pytest.fixture
def scenario(system, transactional_db) -> Iterator[Scenario]:
    with case_on(system) as case:
        yield case


def test_s1_tiers_order_batch_jobs_and_all_stay_below_normal(scenario):
    free, _ = factories.member("free-member", "free")
    pro, _ = factories.member("pro-member", "pro")
    top, _ = factories.member("max-member", "max")
    factories.policy(dispatch_paused=True)
    # Submitted in the reverse of the expected order, so FIFO would fail.
    factories.job(free, priority="batch", model="chat-a", label="free-batch")
    factories.job(pro, priority="batch", model="chat-a", label="pro-batch")
    factories.job(top, priority="batch", model="chat-a", label="max-batch")
    factories.job(free, priority="normal", model="chat-a", label="free-normal")
    assert release_and_wait(scenario, 4) == ["free-normal", "max-batch", "pro-batch", "free-batch"]
    scores = {
        job.body["user"]: job.score_at_dispatch["band"] + job.score_at_dispatch["tier_bonus"]
        for job in Job.objects.all()
    }
    assert (scores["max-batch"], scores["pro-batch"], scores["free-batch"]) == (-98, -99, -100)


def test_s2_batch_overtakes_interactive_only_after_the_band_gap(scenario):
    """Divisor 0.01 s/point: a max batch job needs (100 - (-98)) * 0.01 = 1.98 s more wait."""
    factories.policy(aging_divisor=0.01, dispatch_paused=True)
    top, _ = factories.member("max-member", "max")
    free, _ = factories.member("free-member", "free")
    # Not yet: both submitted together, the interactive job goes first.
    factories.job(top, priority="batch", model="chat-a", label="fresh-batch")
    factories.job(free, priority="interactive", model="chat-a", label="interactive-1")
    assert release_and_wait(scenario, 2) == ["interactive-1", "fresh-batch"]

    scenario.reset_log()
    factories.policy(dispatch_paused=True)
    old = factories.job(top, priority="batch", model="chat-a", label="old-batch")
    wait_for(
        lambda: (db_now() - old.submitted_at).total_seconds() > 2.3,
        message="the batch job to wait longer than the gap",
    )
    factories.job(free, priority="interactive", model="chat-a", label="interactive-2")
    assert release_and_wait(scenario, 2) == ["old-batch", "interactive-2"]
    terms = Job.objects.get(pk=old.pk).score_at_dispatch
    assert terms["aging"] > 198


def test_s3_affinity_breaks_a_near_tie_for_the_resident_model(scenario):
    member, _ = factories.member("ann", "free")
    make_resident(scenario, member, "chat-a")
    # 0.2 s a point: B's head start of 0.4 s or more is worth at least 2 points
    # of aging, still less than the 10 of affinity unless it exceeds 2 s.
    factories.policy(dispatch_paused=True, aging_divisor=0.2)
    waiting = factories.job(member, model="chat-b", label="b-waiting-longer")
    wait_for(
        lambda: (db_now() - waiting.submitted_at).total_seconds() >= 0.4,
        message="B to wait 0.4 s longer",
    )
    factories.job(member, model="chat-a", label="a-resident")
    assert release_and_wait(scenario, 2) == ["a-resident", "b-waiting-longer"]
    a_job = Job.objects.get(body__user="a-resident")
    assert a_job.score_at_dispatch["swap_affinity"] == 10
    b_then = next(c for c in a_job.decisions.get().candidates if c["job_id"] == waiting.pk)
    assert 2 <= b_then["aging"] - a_job.score_at_dispatch["aging"] < 10, b_then
    assert a_job.decisions.get().swap_needed is False
    assert Job.objects.get(body__user="b-waiting-longer").decisions.get().swap_needed is True


def test_s3b_affinity_never_crosses_a_band(scenario):
    member, _ = factories.member("ann", "max")
    make_resident(scenario, member, "chat-a")
    factories.policy(dispatch_paused=True)
    factories.job(member, priority="batch", model="chat-a", label="a-batch")
    factories.job(member, priority="interactive", model="chat-b", label="b-interactive")
    assert release_and_wait(scenario, 2) == ["b-interactive", "a-batch"]


def test_s6_interactive_waits_for_the_running_render_then_goes_next(scenario):
    member, _ = factories.member("ann", "pro")
    render = factories.job(member, priority="batch", model="chat-a", seconds=1.5, label="render")
    wait_for(
        lambda: any(entry["body"]["user"] == "render" for entry in scenario.log()),
        message="the render to start",
    )
    factories.job(member, priority="batch", model="chat-a", label="batch-after")
    factories.job(member, priority="interactive", model="chat-a", label="interactive")
    wait_for(lambda: len(scenario.served()) == 3, message="three jobs served")
    assert scenario.served_labels() == ["render", "interactive", "batch-after"]
    render_entry, interactive_entry, _ = scenario.served()
    # Not preempted: the render ran to its end before the interactive job arrived.
    assert render_entry["finished_at"] <= interactive_entry["received_at"]
    assert Job.objects.get(pk=render.pk).status == JobStatus.SUCCEEDED


@ONE_GPU
def test_s7_free_member_asking_a_million_gets_the_cap(scenario):
    free, _ = factories.member("free-member", "free")
    pro, _ = factories.member("pro-member", "pro")
    factories.policy(dispatch_paused=True)
    greedy = factories.job(free, priority="1000000", model="chat-a", label="free-million")
    factories.job(pro, priority="100", model="chat-a", label="pro-100")
    assert (greedy.priority_requested, greedy.priority) == (1000000, 100)
    # Both at the cap of 100: the pro tier's bonus decides, not the request.
    assert release_and_wait(scenario, 2) == ["pro-100", "free-million"]


@ONE_GPU
def test_s8_header_forms_map_to_bands(scenario):
    member, _ = factories.member("ann", "free")
    factories.policy(dispatch_paused=True)
    for header in [None, "abc", "1.5", " +100 ", "INTERACTIVE", "-100"]:
        factories.job(member, priority=header, model="chat-a", label=repr(header))
    assert release_and_wait(scenario, 6) == [
        "' +100 '",
        "'INTERACTIVE'",
        "None",
        "'abc'",
        "'1.5'",
        "'-100'",
    ]
