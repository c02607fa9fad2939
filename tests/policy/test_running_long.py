"""The holder watchdog's rule and words (queueapp/policy/running_long.py)."""

from hypothesis import given
from hypothesis import strategies as st

from queueapp.policy.running_long import RUNNING_LONG_FACTOR, RunningLong, running_long_after


def test_the_limit_is_three_times_the_estimate_but_never_below_the_policy_minimum():
    assert RUNNING_LONG_FACTOR == 3
    assert running_long_after(estimate_seconds=480, min_seconds=600) == 1440
    assert running_long_after(estimate_seconds=2, min_seconds=600) == 600
    assert running_long_after(estimate_seconds=0.1, min_seconds=1) == 1


@given(
    estimate=st.floats(min_value=0, max_value=1e6, allow_nan=False),
    minimum=st.floats(min_value=0, max_value=1e6, allow_nan=False),
)
def test_the_limit_is_at_least_both_bounds(estimate, minimum):
    limit = running_long_after(estimate_seconds=estimate, min_seconds=minimum)
    assert limit >= minimum and limit >= RUNNING_LONG_FACTOR * estimate
    assert limit in (minimum, RUNNING_LONG_FACTOR * estimate)


def test_the_warning_names_the_gpu_job_member_model_and_minutes_held():
    report = RunningLong(
        job_id=7,
        gpu="gpu1",
        member="ann",
        model="video-wan",
        held_seconds=1860,
        limit_seconds=1440,
        estimate_seconds=480,
    )
    assert report.message() == (
        "running long: gpu1 held by job 7 (member ann, model video-wan) for 31.0 min, "
        "past its limit of 24.0 min (3 x its estimate of 8.0 min, or the policy's minimum)"
    )
    short = RunningLong(
        7, "", "ann", "chat", held_seconds=2.25, limit_seconds=1, estimate_seconds=0.1
    )
    assert "the GPU held by job 7" in short.message()
    assert "for 2.2 s, past its limit of 1.0 s (3 x its estimate of 0.1 s" in short.message()
    assert report.detail() == {
        "gpu": "gpu1",
        "held_seconds": 1860,
        "limit_seconds": 1440,
        "estimate_seconds": 480,
    }
