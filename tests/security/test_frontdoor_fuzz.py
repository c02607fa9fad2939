"""Hypothesis against the OpenAI front door (queueapp/frontdoor/calls.py):
every path it serves, any method, fuzzed priority, wait-bound and
loading-state headers, any body (JSON of any shape, lying content types,
huge strings and numbers, deep nesting, invalid UTF-8, broken multipart
forms). For every call: no 5xx; every 4xx is OpenAI's error object; and
once the call has returned, none of its jobs is left queued or running.

Half of the generated calls are well-formed, for a model the in-process
llama-swap simulator serves in zero seconds, so the accepted path (queued,
granted, relayed, ended) is fuzzed too, headers and all.

`make test` runs GPUSCHED_FUZZ_EXAMPLES (default 20) calls per path;
`make fuzz` runs 1000.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import psycopg
import pytest
from django.db.models import Max
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st

from gpusched.upstreams import parse_upstreams
from queueapp import services
from queueapp.api.documented import PRIORITY_HEADER
from queueapp.frontdoor.gateway import abandon
from queueapp.frontdoor.model_list import MODELS_PATH
from queueapp.frontdoor.waiting import LOADING_STATE_HEADER
from queueapp.job_body import UPLOAD_PATHS
from queueapp.live.events import listener_connection_params
from queueapp.locks import DISPATCHER_LOCK_CLASS
from queueapp.models import Job, JobStatus
from queueapp.policy.wait_bound import MAX_WAIT_HEADER, WaitBoundInvalid, parse_max_wait_header
from queueapp.upstream.client import FRONT_DOOR_PATHS
from queueapp.upstream.simulator import LlamaSwapSimulator
from queueapp.upstream.simulator.routes import MODEL_ROUTES
from tests import factories
from tests.frontdoor.client import front_door_call
from tests.security.frontdoor_fuzz_helpers import CALL_DEADLINE_SECONDS, openai_error_problem

EXAMPLES = int(os.environ.get("GPUSCHED_FUZZ_EXAMPLES", "20"))
# Every model answers at once: an accepted call costs milliseconds.
MODELS = ("chat-small", "image-xl", "whisper", "ünï-código")
UNFINISHED = (JobStatus.QUEUED, JobStatus.RUNNING)


@pytest.fixture(scope="module")
def llama_swap() -> Iterator[LlamaSwapSimulator]:
    sim = LlamaSwapSimulator(
        models=dict.fromkeys(MODELS, 0.0), default_seconds=0.0, swap_seconds=0.0
    ).start()
    yield sim
    sim.stop()


@pytest.fixture
def token(default_tiers, llama_swap, settings) -> Iterator[str]:
    """A member's key, and one GPU at the simulator that the front door may
    claim: registered, seen reachable, its dispatcher's lock held (as
    tests/frontdoor/conftest.py's `gateway_session` holds it). It is the
    configured upstream (LLAMA_SWAP_URL) too: `GET /v1/models` asks that one
    before the process's gateway has read the registered GPUs, as each
    call's fresh gateway here has not."""
    settings.GPUSCHED_UPSTREAMS = parse_upstreams(llama_swap.url)
    _, key = factories.member("fuzz", "pro")
    gpu = services.gpu_register(name="gpu0", url=llama_swap.url)
    services.gpu_state_record(gpu_id=gpu.pk, reachable=True, resident_model=None)
    with psycopg.connect(**listener_connection_params(), autocommit=True) as session:
        session.execute("SELECT pg_advisory_lock(%s, %s)", [DISPATCHER_LOCK_CLASS, gpu.pk])
        yield key


# --- Strategies --------------------------------------------------------------

# What HTTP can carry in a header value: latin-1, without CR, LF or NUL.
header_text = st.text(
    st.characters(min_codepoint=1, max_codepoint=255, exclude_characters="\r\n"), max_size=40
)
header_value = st.one_of(
    st.none(),
    st.sampled_from(
        ["interactive", "batch", " +7 ", "-1000", "0", "0.5", "1e308", "1" * 400, "nan", "inf"]
        + ["reasoning", "REASONING ", "comments", "", "\xe9\xff"]
    ),
    header_text,
)
# A bound the forecast may meet (or refuse with the documented 503), or anything.
max_wait_value = st.one_of(st.none(), st.floats(0.001, 1e9).map(str), header_value)
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()  # NaN and infinities too: Python's json writes them as bare words
    | st.text(max_size=20)
)
any_json = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner),
    max_leaves=12,
).filter(lambda v: not isinstance(v, dict) or "sim" not in v)  # the simulator's key: a 5xx
long_text = st.text(min_size=300, max_size=600) | st.just("\u00fc\u4e2d\U0001f916" * 120)
# Raw JSON numbers Python's parser reads as inf, as a 400-digit int, or refuses.
huge_numbers = st.sampled_from(["1e308", "1e400", "-1e400", "1" + "0" * 400, "9" * 5000, "NaN"])


def dumps(value: object, ascii_only: bool) -> bytes:
    return json.dumps(value, ensure_ascii=ascii_only).encode()


@st.composite
def request_object(draw: st.DrawFn, *, valid: bool) -> bytes:
    """A JSON request for a model path. `valid`: a model the simulator serves
    and fields of the types llama-swap's servers take (their values fuzzed);
    else any model and fields of any type, a huge number spliced in at times."""
    fields = {
        "messages": st.lists(
            st.fixed_dictionaries({"role": st.just("user"), "content": st.text()}), max_size=2
        ),
        "prompt": st.text() | long_text,
        "input": st.text(),
        "stream": st.booleans(),
        "max_tokens": st.integers() | st.just(10**400) | st.just(1e308),
        "priority": any_json,  # any value is read (as 0 at worst), never refused
    }
    if not valid:
        fields = dict.fromkeys(fields, any_json)
    model = st.sampled_from(MODELS) if valid else (long_text | any_json | st.sampled_from(MODELS))
    body = draw(st.fixed_dictionaries({"model": model}, optional=fields))
    raw = dumps(body, draw(st.booleans()))
    if not valid and draw(st.booleans()):
        raw = raw[:-1] + b', "max_tokens": ' + draw(huge_numbers).encode() + b"}"
    return raw


nested = st.sampled_from(
    [
        b"[" * 10_000 + b"]" * 10_000,
        b"[" * 10_000,
        b'{"model": "chat-small", "x": ' + b"[" * 10_000 + b"]" * 10_000 + b"}",
        b'{"model": "chat-small", "x": ' + b"[" * 100 + b"]" * 100 + b"}",
    ]
)
any_body = st.one_of(
    request_object(valid=False),
    st.builds(dumps, any_json, st.booleans()),
    nested,
    st.binary(max_size=64),  # invalid UTF-8, mostly
    st.sampled_from([b'{"model": "\xff\xfe"}', b'{"model": "chat-small", "x": "\xc3"}', b""]),
)


def form(parts: list[tuple[bytes, bytes, bytes | None]], boundary: bytes) -> bytes:
    """A multipart form of (name, value, file name or None) parts."""
    return b"".join(
        b'--%s\r\nContent-Disposition: form-data; name="%s"%s\r\n\r\n%s\r\n'
        % (boundary, name, b'; filename="%s"' % file if file else b"", value)
        for name, value, file in parts
    ) + (b"--%s--\r\n" % boundary)


@st.composite
def valid_form(draw: st.DrawFn) -> tuple[bytes, str]:
    """A transcription's or an image edit's form for a model the simulator serves."""
    model = draw(st.sampled_from(MODELS)).encode()
    audio = draw(st.binary(max_size=64))
    extra = draw(st.lists(st.tuples(st.sampled_from([b"language", b"prompt"]), st.binary())))
    parts = [(b"model", model, None), (b"file", audio, b"a.wav"), *((n, v, None) for n, v in extra)]
    return form(draw(st.permutations(parts)), b"XX"), "multipart/form-data; boundary=XX"


@st.composite
def any_form(draw: st.DrawFn) -> tuple[bytes, str]:
    """A form with its boundary right, wrong or missing, its parts files or
    fields of any bytes, names and file names invalid UTF-8 at times."""
    boundary = draw(st.sampled_from([b"XX", b"----gpusched", b'"q"', b"\xe9"]))
    names = st.sampled_from([b"model", b"model", b"file", b"language", b'a"b', b"\xff\xfe"])
    values = st.one_of(
        st.sampled_from(MODELS).map(str.encode), long_text.map(str.encode), st.binary(max_size=40)
    )
    files = st.sampled_from([None, b"a.wav", b"\xff.wav"])
    body = form(draw(st.lists(st.tuples(names, values, files), max_size=4)), boundary)
    body = body[: draw(st.sampled_from([len(body), len(body) - 4, len(body) // 2]))]
    if draw(st.integers(0, 4)) == 0:  # garbage in front
        body = draw(st.binary(max_size=32)) + body
    declared = draw(st.sampled_from([boundary, boundary, b"YY", None]))
    content_type = "multipart/form-data" + (
        f"; boundary={declared.decode('latin-1')}" if declared is not None else ""
    )
    if draw(st.integers(0, 4)) == 0:  # a form labelled JSON, or not labelled
        content_type = draw(st.sampled_from(["application/json", ""]))
    return body, content_type


JSON_TYPES = st.sampled_from(["application/json", "application/json; charset=utf-8"])
# A JSON body labelled as something else (llama-swap then reads a form), or anything.
any_content_type = st.one_of(
    JSON_TYPES,
    st.sampled_from(["text/plain", "", "multipart/form-data; boundary=XX"]),
    st.sampled_from(["application/x-www-form-urlencoded", "application/json, text/plain"]),
    header_text,
)


@dataclass(frozen=True)
class FuzzCall:
    """One call; a header None is absent. Its repr, in a failure's report,
    shows the start of a body that may be megabytes of brackets."""

    method: str
    target: str
    body: bytes
    headers: dict[str, str | None]
    anonymous: bool = False  # no Authorization header; else the member's key

    def __repr__(self) -> str:
        body = f"{self.body[:300]!r}" + (
            f"... ({len(self.body)} bytes)" if len(self.body) > 300 else ""
        )
        key = " (no key)" if self.anonymous else ""
        headers = {name: value for name, value in self.headers.items() if value is not None}
        return f"{self.method} {self.target}{key} {headers} body {body}"


@st.composite
def front_door_calls(draw: st.DrawFn, path: str) -> FuzzCall:
    """Half of the calls well-formed (POST, a body the simulator answers, a
    bound that may be met): the accepted path, with headers of any text.
    The other half anything: method, body, content type, query."""
    if path == MODELS_PATH:
        method, target = draw(st.sampled_from(["GET"] * 4 + ["POST", "DELETE"])), path
        body, content_type = b"", draw(st.none() | any_content_type)
    elif draw(st.booleans()):
        method, target = "POST", path
        if path in UPLOAD_PATHS and draw(st.booleans()):
            body, content_type = draw(valid_form())
        else:
            body, content_type = draw(request_object(valid=True)), draw(JSON_TYPES)
    else:
        method = draw(st.sampled_from(["POST"] * 4 + ["GET", "PUT", "DELETE", "PATCH", "HEAD"]))
        query = ["", "?model=chat-small", "?model=%00", "?model=" + "m" * 300]
        target = path + draw(st.sampled_from(query))
        if path in UPLOAD_PATHS and draw(st.booleans()):
            body, content_type = draw(any_form())
        else:
            body, content_type = draw(any_body), draw(any_content_type)
    headers = {
        "Content-Type": content_type,
        PRIORITY_HEADER: draw(header_value),
        MAX_WAIT_HEADER: draw(max_wait_value),
        LOADING_STATE_HEADER: draw(header_value),
    }
    # Without a key now and then: its 401 is OpenAI's error too. (A wrong key
    # would count as a guess, and the login limit would refuse the calls after.)
    anonymous = all(draw(st.booleans()) for _ in range(3))  # one call in 8
    return FuzzCall(method, target, body, headers, anonymous)


# --- The checks ---------------------------------------------------------------


def call(token: str, sent: FuzzCall) -> httpx.Response:
    key = [] if sent.anonymous else [(b"authorization", f"Bearer {token}".encode())]
    headers = key + [
        (name.lower().encode(), value.encode("latin-1"))
        for name, value in sent.headers.items()
        if value is not None
    ]
    before = Job.objects.aggregate(last=Max("pk"))["last"] or 0
    try:
        response = front_door_call(
            sent.method, sent.target, sent.body, headers, deadline=CALL_DEADLINE_SECONDS
        )
    finally:
        # Refused or answered, the call has returned: nothing of it may wait or
        # hold a GPU. What does is checked below, and ended here first, so that
        # the next example finds the GPU free (else its call would wait).
        left = list(Job.objects.filter(pk__gt=before, status__in=UNFINISHED).values("pk", "status"))
        for job in left:
            abandon(job["pk"], "left behind by a fuzzed call")
    where = f"{sent!r}" + (f", leaving {left}" if left else "")
    status = response.status_code
    assert status < 500 or documented_busy(response, sent), (
        f"{status} for {where}: {response.content[:500]!r}"
    )
    # A HEAD answer has no body to check.
    if status >= 400 and sent.method != "HEAD" and not relayed(response):
        problem = openai_error_problem(response)
        assert problem is None, f"{status} for {where}: {problem}"
    assert not left, f"{status} for {where}"
    return response


def relayed(response: httpx.Response) -> bool:
    """Whether `response` is llama-swap's own answer, relayed as it came (the
    simulator's plain-text 404 for a path it does not route, say): its job
    ran and stored that status. Only gpusched's own refusals owe OpenAI's shape."""
    job_id = response.headers.get("x-gpusched-job-id")
    return (
        bool(job_id)
        and Job.objects.filter(pk=int(job_id), result_status_code=response.status_code).exists()
    )


def documented_busy(response: httpx.Response, sent: FuzzCall) -> bool:
    """A wait bound the forecast cannot meet is refused by design (503
    gpu_busy, nothing queued): the one 5xx the front door may answer."""
    try:
        bound = parse_max_wait_header(sent.headers.get(MAX_WAIT_HEADER))
    except WaitBoundInvalid:
        return False
    return (
        bound is not None
        and response.status_code == 503
        and b'"code": "gpu_busy"' in response.content
    )


FUZZED_PATHS = [*FRONT_DOOR_PATHS, MODELS_PATH]


@pytest.mark.django_db
@pytest.mark.parametrize("path", FUZZED_PATHS)
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    # Every call costs tens of milliseconds: one bug shrunk, no explain phase
    # (hundreds of calls more), so a failing run stays short.
    report_multiple_bugs=False,
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
)
@given(data=st.data())
def test_every_front_door_call_is_answered_in_openai_shape_and_leaves_no_job(token, path, data):
    response = call(token, data.draw(front_door_calls(path)))
    event(f"status {response.status_code}")  # shown by pytest --hypothesis-show-statistics


# --- Pinned inputs: tried on every run, whatever the fuzzer generates ---------

FORM_TYPE = "multipart/form-data; boundary=XX"


def transcription(model: str) -> bytes:
    return form([(b"model", model.encode(), None), (b"file", b"RIFF\x00\x00", b"a.wav")], b"XX")


PINNED = [
    pytest.param(
        "/v1/chat/completions",
        "application/json",
        json.dumps({"model": "m" * 300, "messages": []}).encode(),
        id="chat with a 300-character model",
    ),
    pytest.param(
        "/v1/audio/transcriptions",
        FORM_TYPE,
        transcription("\u00fc\u4e2d\U0001f916" * 100),
        id="transcription form with a 300-character non-ASCII model",
    ),
]


@pytest.mark.django_db
@pytest.mark.parametrize(("path", "content_type", "body"), PINNED)
def test_a_model_name_too_long_is_a_400_naming_the_model(token, path, content_type, body):
    response = call(token, FuzzCall("POST", path, body, {"Content-Type": content_type}))
    assert response.status_code == 400, response.content[:300]
    error = response.json()["error"]
    assert error["param"] == "model" and error["code"] == "invalid_model", error
    assert not Job.objects.exists()


# Inputs the fuzzer found (a 500 each when found), tried on every run.
FOUND = [
    pytest.param(
        "/v1/chat/completions",
        "application/json",
        b'{"model": "chat-small", "temperature": NaN}',
        id="NaN in a JSON body",
    ),
    pytest.param(
        "/v1/chat/completions",
        "application/json",
        b'{"model": "chat-small", "max_tokens": 1e400}',
        id="a number past a float's range in a JSON body",
    ),
    pytest.param(
        "/v1/audio/transcriptions",
        FORM_TYPE,
        b'--XX\r\nContent-Disposition: form-data; name="\xff"\r\n\r\nx\r\n--XX--\r\n',
        id="a form field named in invalid UTF-8",
    ),
    pytest.param(
        "/v1/chat/completions",
        "application/json; x=\xe9",
        b'{"model": "chat-small"}',
        id="a non-ASCII content type on a call that is relayed",
    ),
    pytest.param(
        # make fuzz at 1,000 examples: httpx would not send the header on (a 502).
        "/v1/chat/completions?model=chat-small",
        "\x0c",
        b"[[]]",
        id="a control character in the content type of a call that would be relayed",
    ),
    pytest.param(
        # make test's fuzz: httpx would not send a value of whitespace alone (a 502).
        "/v1/rerank?model=chat-small",
        " ",
        b"[" * 20000,
        id="a content type of one space on a call that is relayed",
    ),
]


@pytest.mark.django_db
@pytest.mark.parametrize(("path", "content_type", "body"), FOUND)
def test_inputs_the_fuzzer_found_are_answered_and_leave_no_job(token, path, content_type, body):
    call(token, FuzzCall("POST", path, body, {"Content-Type": content_type}))


def valid_call(path: str) -> tuple[bytes, str]:
    if path == "/v1/audio/transcriptions":
        return transcription("whisper"), FORM_TYPE
    return json.dumps({"model": "chat-small", "prompt": "hi"}).encode(), "application/json"


@pytest.mark.django_db
@pytest.mark.parametrize("path", FRONT_DOOR_PATHS)
def test_a_valid_call_on_every_path_is_relayed_and_its_job_ends(token, path):
    """The accepted path, on every run: the fuzz's other half cannot count on luck."""
    body, content_type = valid_call(path)
    response = call(token, FuzzCall("POST", path, body, {"Content-Type": content_type}))
    # The simulator routes no rerank: its 404 is relayed as llama-swap's would be.
    assert response.status_code == (200 if path in MODEL_ROUTES else 404), response.content[:300]
    job = Job.objects.get(pk=int(response.headers["x-gpusched-job-id"]))
    assert job.path == path and job.result_status_code == response.status_code, job.error
    assert job.status == (JobStatus.SUCCEEDED if path in MODEL_ROUTES else JobStatus.FAILED)
