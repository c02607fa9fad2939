import pytest
from hypothesis import given
from hypothesis import strategies as st

from queueapp.policy import clamp_priority, parse_priority_header
from queueapp.policy.priority import PRIORITY_LIMIT


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        # S8 from DESIGN.md
        (None, 0),
        ("abc", 0),
        ("1.5", 0),
        (" +100 ", 100),
        ("INTERACTIVE", 100),
        ("-100", -100),
        # more of the same rule
        ("", 0),
        ("batch", -100),
        ("Normal", 0),
        ("  -7", -7),
        ("+-1", 0),
        ("1e3", 0),
        ("0x10", 0),
        ("١٢", 0),  # non-ASCII digits are not a decimal integer here
        ("99999999999999999999999999", PRIORITY_LIMIT),
        ("-99999999999999999999999999", -PRIORITY_LIMIT),
    ],
)
def test_header_parsing(header, expected):
    assert parse_priority_header(header) == expected


@given(st.one_of(st.none(), st.text()))
def test_parsing_never_raises_and_stays_in_range(raw):
    value = parse_priority_header(raw)
    assert -PRIORITY_LIMIT <= value <= PRIORITY_LIMIT


@given(st.integers(min_value=-(10**6), max_value=10**6))
def test_integers_round_trip(number):
    assert parse_priority_header(f" {number:+d} ") == number


def test_s7_request_above_cap_is_clamped_not_rejected():
    requested = parse_priority_header("1000000")
    assert requested == 1000000
    assert clamp_priority(requested, floor=-1000, cap=100) == 100
    assert clamp_priority(-5000, floor=-1000, cap=100) == -1000
