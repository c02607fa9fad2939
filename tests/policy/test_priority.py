import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from queueapp.policy import BAND_ALIASES, clamp_priority, parse_priority_header
from queueapp.policy.priority import (
    PRIORITY_LIMIT,
    PathBandsInvalid,
    band_for_path,
    body_without_priority,
    default_priority_by_path,
    parse_priority_value,
    path_bands,
    requested_priority,
)
from queueapp.policy.score import ALIAS_SPACING


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


# A `priority` in the body, and the band of a path that names none.


def test_background_is_the_batch_band():
    assert BAND_ALIASES["background"] == BAND_ALIASES["batch"] == -100
    assert parse_priority_header(" Background ") == -100
    assert ALIAS_SPACING == 100  # two names for one band do not narrow the spacing


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (100, 100),
        (-7, -7),
        ("interactive", 100),
        ("background", -100),
        (" +50 ", 50),
        ("abc", 0),
        (1.5, 0),  # as the header's "1.5"
        (100.0, 0),
        (True, 0),
        ([100], 0),
        ({"band": 100}, 0),
        (10**30, PRIORITY_LIMIT),
        (-(10**30), -PRIORITY_LIMIT),
    ],
)
def test_a_body_value_follows_the_headers_rules(value, expected):
    assert parse_priority_value(value) == expected


def test_the_header_wins_then_the_body_then_the_paths_band():
    assert requested_priority(header="batch", body="interactive", default=100) == -100
    assert requested_priority(header="abc", body="interactive", default=100) == 0
    assert requested_priority(header=None, body="interactive", default=0) == 100
    assert requested_priority(header=None, body="abc", default=100) == 0  # named, unparseable
    assert requested_priority(header=None, body=None, default=100) == 100  # null: not named
    assert requested_priority(header=None) == 0


def test_a_paths_band_defaults_to_speech_and_transcriptions_first():
    defaults = default_priority_by_path()
    assert band_for_path("/v1/audio/speech", defaults) == 100
    assert band_for_path("/v1/audio/transcriptions", defaults) == 100
    assert band_for_path("/v1/chat/completions", defaults) == 0
    assert band_for_path("/v1/audio/speech", {}) == 0
    defaults["/v1/chat/completions"] = 5
    assert default_priority_by_path()["/v1/audio/speech"] == 100  # a fresh copy each time
    assert "/v1/chat/completions" not in default_priority_by_path()


def test_path_bands_store_aliases_as_bands_and_name_the_entry_at_fault():
    known = ("/v1/audio/speech", "/v1/images/generations")
    bands = path_bands({"/v1/audio/speech": "Interactive", "/v1/images/generations": "-100"})
    assert bands == {"/v1/audio/speech": 100, "/v1/images/generations": -100}
    assert path_bands(None) == {}
    with pytest.raises(PathBandsInvalid, match=r"/v1/audio/speech: 'soon' is not a band"):
        path_bands({"/v1/audio/speech": "soon"}, known_paths=known)
    with pytest.raises(PathBandsInvalid, match=r"'/v1/audio/speach' is not a path gpusched"):
        path_bands({"/v1/audio/speach": 100}, known_paths=known)
    with pytest.raises(PathBandsInvalid, match="is not a path"):
        path_bands({"v1/audio/speech": 100})
    with pytest.raises(PathBandsInvalid, match="not a band"):
        path_bands({"/v1/audio/speech": 1.5})
    with pytest.raises(PathBandsInvalid, match="an object"):
        path_bands(["/v1/audio/speech"])


@pytest.mark.parametrize(
    ("raw", "forwarded"),
    [
        (b'{"model":"m","priority":"batch","messages":[]}', b'{"model":"m","messages":[]}'),
        (b'{"priority": 5, "model": "m"}', b'{"model": "m"}'),
        (b'{\n  "model": "m",\n  "priority": -100\n}\n', b'{\n  "model": "m"\n}\n'),
        (b'{"priority":1}', b"{}"),
        # json.loads keeps the last of two; both go.
        (b'{"priority":1,"model":"m","priority":2}', b'{"model":"m"}'),
        # Only the top level is the caller's ask; a nested one is the model's input.
        (
            b'{"model":"m","tools":[{"priority":1}],"priority":"x"}',
            b'{"model":"m","tools":[{"priority":1}]}',
        ),
        ('{"model":"caf\\u00e9 é","priority":1}'.encode(), '{"model":"caf\\u00e9 é"}'.encode()),
        (b'{"model":"m"}', b'{"model":"m"}'),
    ],
)
def test_the_priority_is_cut_out_and_every_other_byte_stays(raw, forwarded):
    assert body_without_priority(raw) == forwarded


def test_a_body_that_is_not_utf_8_is_written_again_in_its_key_order():
    raw = '{"model":"é","priority":1,"n":2}'.encode("utf-16")
    assert body_without_priority(raw) == '{"model":"é","n":2}'.encode()


_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=8,
)


@given(
    st.dictionaries(st.sampled_from(["model", "priority", "n", "é", 'a"b']), _JSON_VALUES),
    st.sampled_from([(",", ":"), (", ", ": "), (",\n ", " :\t")]),
    st.booleans(),
)
def test_cutting_leaves_the_same_object_without_its_priority(body, separators, ascii_only):
    raw = json.dumps(body, separators=separators, ensure_ascii=ascii_only).encode()
    forwarded = body_without_priority(raw)
    assert json.loads(forwarded) == {k: v for k, v in body.items() if k != "priority"}
    if "priority" not in body:
        assert forwarded == raw
    else:
        expected = {k: v for k, v in body.items() if k != "priority"}
        assert (
            forwarded
            == json.dumps(expected, separators=separators, ensure_ascii=ascii_only).encode()
        )
