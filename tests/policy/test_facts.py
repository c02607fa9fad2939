"""The facts `decide` rests on, built once (queueapp/policy/facts.py)."""

from queueapp.policy.facts import (
    DEFAULT_RUNNING_LIMIT,
    MemberLimits,
    cluster_facts,
    gpus_alone,
    lane_eligible_at,
    models_run,
    models_shorter_than,
    queued_candidate,
)


def test_a_gpu_is_alone_when_it_is_the_only_enabled_one():
    assert gpus_alone(0) and gpus_alone(1)
    assert not gpus_alone(2)


def test_the_models_a_gpu_runs():
    # Its list read, narrowed by the operator's.
    assert models_run(["a", "b"], ["b", "c"], alone=False) == {"b"}
    assert models_run(["a", "b"], [], alone=False) == {"a", "b"}
    # Not read yet: any model, unless the operator narrowed them.
    assert models_run(None, [], alone=False) is None
    assert models_run(None, ["c"], alone=False) == {"c"}
    # Alone, as a single llama-swap: any model but those left out.
    assert models_run(["a"], [], alone=True) is None
    assert models_run(["a"], ["z"], alone=True) == {"z"}


def test_short_models_are_those_learned_under_the_bound():
    learned = {"chat": 5.0, "video": 600.0}
    assert models_shorter_than(learned, 60.0) == {"chat"}
    assert models_shorter_than(learned, None) is None
    assert models_shorter_than({}, 60.0) == frozenset()  # none learned: none short


def test_a_job_behind_its_head_ages_from_its_lanes_clock():
    assert lane_eligible_at(submitted_at=10.0, lane_clock=None) == 10.0
    assert lane_eligible_at(submitted_at=10.0, lane_clock=25.0) == 25.0
    assert lane_eligible_at(submitted_at=30.0, lane_clock=25.0) == 30.0
    fields = dict(
        job_id=1,
        band=0,
        tier_bonus=0.0,
        model="a",
        submitted_at=10.0,
        member_id=7,
        eligible_at=15.0,
    )
    head = queued_candidate(**fields, is_lane_head=True, lane_clock=25.0, wait_deadline=99.0)
    behind = queued_candidate(**fields, is_lane_head=False, lane_clock=25.0, pinned_gpu="")
    assert (head.eligible_at, head.wait_deadline) == (15.0, 99.0)
    assert (behind.eligible_at, behind.pinned_gpu) == (25.0, None)


def test_alone_no_running_limit_binds_and_nobody_borrows():
    limits = MemberLimits(limits={7: 2}, strict=frozenset({8}))
    alone = cluster_facts(enabled_gpus=1, gpus_held={7: frozenset({"gpu0"})}, limits=limits)
    assert alone.running_limit is None and alone.borrowing is None
    several = cluster_facts(
        enabled_gpus=2,
        gpus_held={},
        limits=limits,
        keep_idle=1,
        borrow_max_seconds=60.0,
        expected_seconds={"chat": 5.0},
    )
    assert several.running_limit is not None
    assert several.running_limit(7) == 2
    assert several.running_limit(9) == DEFAULT_RUNNING_LIMIT
    assert several.borrowing is not None
    assert several.borrowing.short_models == {"chat"}
    assert several.borrowing.strict_members == {8}
    assert cluster_facts(enabled_gpus=2, gpus_held={}, limits=limits, lends=False).borrowing is None
