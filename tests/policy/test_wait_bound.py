"""Wait bounds as plain rules: the header, the policy's defaults, the words."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from queueapp.policy.wait_bound import (
    GpuHeld,
    Holder,
    WaitBoundInvalid,
    band_defaults,
    bound_for,
    busy_message,
    parse_max_wait_header,
    refusal_tail,
    retry_after,
)


@pytest.mark.parametrize(
    ("header", "expected"),
    [(None, None), ("60", 60.0), (" 2.5 ", 2.5), ("0.1", 0.1), ("86400", 86400.0)],
)
def test_a_positive_number_of_seconds_is_the_bound(header, expected):
    assert parse_max_wait_header(header) == expected


@pytest.mark.parametrize(
    "header", ["", "abc", "-5", "0", "-0.0", "nan", "inf", "1e9", "60s", "1,5", "true"]
)
def test_anything_else_is_refused_with_the_value_named(header):
    with pytest.raises(WaitBoundInvalid) as refused:
        parse_max_wait_header(header)
    assert str(refused.value)


def test_band_defaults_take_aliases_and_store_integers():
    assert band_defaults({"interactive": 30, "-100": 3600, " 5 ": 1.5}) == {
        "100": 30.0,
        "-100": 3600.0,
        "5": 1.5,
    }
    assert band_defaults(None) == {} and band_defaults({}) == {}


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ({"urgent": 5}, "'urgent' is not a band"),
        ({"0": -1}, "band 0"),
        ({"0": "soon"}, "band 0"),
        ({"0": True}, "band 0"),
        ([5], "an object"),
    ],
)
def test_band_defaults_refuse_what_is_not_a_band_and_seconds(value, named):
    with pytest.raises(WaitBoundInvalid, match=named):
        band_defaults(value)


def test_the_header_wins_over_the_band_default():
    defaults = {"0": 30.0}
    assert bound_for(header=5.0, band=0, defaults=defaults) == 5.0
    assert bound_for(header=None, band=0, defaults=defaults) == 30.0
    assert bound_for(header=None, band=100, defaults=defaults) is None


def test_the_message_names_each_holder_and_the_jobs_ahead():
    message = busy_message(
        gpus=[
            GpuHeld("gpu0", (Holder(17, "image-xl", 0, 12.44),)),
            GpuHeld("gpu1", ()),
        ],
        ahead=19,
        tail=refusal_tail(start_in=340.2, bound=60),
    )
    assert message == (
        "gpu0 held by job 17 (image-xl, band 0) for 12.4 s; gpu1 idle; 19 jobs wait ahead; "
        "estimated start in 340 s is past the 60 s bound"
    )
    one = busy_message(gpus=[], ahead=1, tail="t")
    assert one == "no GPU can run it now; 1 job waits ahead; t"


@given(st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True)))
def test_retry_after_is_a_whole_second_at_least(seconds):
    value = retry_after(seconds, fallback=5)
    assert isinstance(value, int) and value >= 1
    if seconds is not None and math.isfinite(seconds) and seconds >= 1:
        assert value == math.ceil(seconds)
