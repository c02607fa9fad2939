"""Malformed and oversized input gets a 4xx with a message a person can read,
on the REST API and on the OpenAI front door; never a 5xx, never a job.

In-process cases use Django's test client; the cases whose limits belong to
the web server (huge headers, huge bodies, broken HTTP) run against Daphne,
started as `make run` starts it.
"""

from __future__ import annotations

import contextlib
import json
import socket

import httpx
import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.db import connections
from django.test import Client

from gpusched.asgi import application
from queueapp import services
from queueapp.live.hub import hub
from queueapp.models import Job
from tests import factories
from tests.frontdoor.client import FrontDoorClient

API = "/api/jobs/"
FRONT_DOOR = "/v1/chat/completions"
MIB = 1024 * 1024


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def job_payload(body: object, **extra: object) -> str:
    return json.dumps({"path": FRONT_DOOR, "body": body, **extra})


JSON = "application/json"
MODEL = {"model": "m"}


def with_chain(**chain: object) -> str:
    return job_payload(MODEL, chain={"id": "c", "index": 0, "total": 1, **chain})


# (name, content type, raw body, words the answer's message must contain)
API_BODIES = [
    ("invalid JSON", JSON, '{"path": "/v1/chat/completions", "body": {', "JSON"),
    ("empty body", JSON, "", "path"),
    ("JSON array", JSON, "[1, 2]", "dictionary"),
    ("JSON string", JSON, '"hello"', "dictionary"),
    ("NaN", JSON, '{"path": NaN}', "JSON"),
    ("text/plain", "text/plain", job_payload(MODEL), "Unsupported media type"),
    ("form", "application/x-www-form-urlencoded", "path=x&body=y", "Unsupported media type"),
    ("no content type", "", job_payload(MODEL), "Unsupported media type"),
    ("invalid UTF-8", JSON, b'{"path": "\xff\xfe"}', "JSON"),
    ("100k nested arrays", JSON, nested(100_000), "nested too deeply"),
    (
        "100k nested arrays in body",
        JSON,
        '{"path": "/v1/chat/completions", "body": ' + nested(100_000) + "}",
        "nested too deeply",
    ),
    (
        "body nested 200 deep",
        JSON,
        '{"path": "/v1/chat/completions", "body": {"model": "m", "x": ' + nested(200) + "}}",
        "body: nested deeper than 64",
    ),
    ("NUL in body", JSON, job_payload({"model": "m\u0000"}), "body: contains the NUL"),
    (
        "1e400 in body",
        JSON,
        '{"path": "/v1/chat/completions", "body": {"model": "m", "max_tokens": 1e400}}',
        "body: Value must be valid JSON",
    ),
    ("NUL in a key", JSON, job_payload({"model": "m", "\u0000": 1}), "NUL"),
    (
        "unpaired surrogate",
        JSON,
        '{"path": "/v1/chat/completions", "body": {"model": "m", "x": "\\udc00"}}',
        "body: contains an unpaired surrogate",
    ),
    (
        "surrogate field name",
        JSON,
        '{"path": "/v1/chat/completions", "body": {"model": "m"}, "\\ud800": 1}',
        "unknown field",
    ),
    (
        "over the limit",
        JSON,
        job_payload({"model": "m", "p": "a" * (2 * MIB)}),
        "GPUSCHED_MAX_BODY_BYTES raises it",
    ),
    ("body not an object", JSON, job_payload([1, 2]), "body: must be a JSON object"),
    ("model missing", JSON, job_payload({"prompt": "x"}), "body.model: required"),
    ("model not a string", JSON, job_payload({"model": 5}), "body.model"),
    ("path unknown", JSON, json.dumps({"path": "/admin/", "body": MODEL}), "path"),
    ("chain id a number", JSON, with_chain(id=5), "chain.id: must be a string"),
    ("chain index a string", JSON, with_chain(index="0"), "chain.index: must be an integer"),
    ("chain total huge", JSON, with_chain(total=2**40), "chain.total"),
    ("chain id NUL", JSON, with_chain(id="\u0000"), "chain.id"),
    ("callback NUL", JSON, job_payload(MODEL, callback_url="https://a.example/\u0000"), "callback"),
    ("callback private", JSON, job_payload(MODEL, callback_url="http://127.0.0.1/"), "callback"),
    ("unknown field", JSON, job_payload(MODEL, priorty=5), "priorty: unknown field"),
]


@pytest.fixture
def member(default_tiers):
    return factories.member("mallory", "free")


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("content_type", "raw", "words"),
    [case[1:] for case in API_BODIES],
    ids=[case[0] for case in API_BODIES],
)
def test_malformed_job_submissions_are_4xx_with_a_message(member, content_type, raw, words):
    _, token = member
    response = Client().post(
        API, data=raw, content_type=content_type, HTTP_AUTHORIZATION=f"Bearer {token}"
    )
    assert 400 <= response.status_code < 500, response.content[:300]
    assert response["Content-Type"] == "application/json"
    assert words in response.json()["detail"], response.json()
    assert not Job.objects.exists()


PRIORITY_HEADERS = [
    ("garbage", "!!??", 0),
    ("NUL", "1\x002", 0),
    ("unicode digits", "\u0661\u0660\u0660", 0),  # Arabic-Indic 100: not the ASCII number
    ("fullwidth digits", "\uff11\uff10\uff10", 0),
    ("emoji", "\U0001f4a5", 0),
    ("64 KiB of digits", "9" * 65536, 100),  # saturated, then the tier's cap
    ("64 KiB of minus", "-" + "9" * 65536, -1000),  # the tier's floor
    ("float", "1e3", 0),
]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("header", "applied"),
    [case[1:] for case in PRIORITY_HEADERS],
    ids=[case[0] for case in PRIORITY_HEADERS],
)
def test_a_malformed_priority_header_means_0_as_the_contract_says(member, header, applied):
    """DESIGN.md: absent or unparseable means 0; a number is clamped, never refused."""
    _, token = member
    response = Client().post(
        API,
        data=job_payload({"model": "m"}),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
        HTTP_X_LLAMASWAP_PRIORITY=header,
    )
    assert response.status_code == 201, response.content[:300]
    assert response.json()["priority"] == applied


BAD_PATHS = [
    ("/api/jobs/abc/", 404),
    ("/api/jobs/-1/", 404),
    ("/api/jobs/1.5/", 404),
    ("/api/jobs/99999999999999999999999999/", 404),
    ("/api/jobs/9223372036854775808/why/", 404),
    ("/api/jobs/%00/", 404),
    ("/api/chains/%00/", 404),
    ("/api/chains/%ff%fe/", 404),
    ("/api/chains/" + "c" * 5000 + "/", 404),
    ("/api/nowhere/", 404),
    ("/api/jobs/?status=%00", 400),
    ("/api/jobs/?status=" + "q" * 5000, 400),
    ("/api/jobs/?stauts=queued", 400),
    ("/api/stats/?window=%ff", 400),
    ("/api/queue/?%00=1", 400),
]


@pytest.mark.django_db
@pytest.mark.parametrize(("path", "status"), BAD_PATHS, ids=[p[:40] for p, _ in BAD_PATHS])
def test_malformed_paths_and_queries_are_4xx_json(member, path, status):
    _, token = member
    response = Client().get(path, HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == status, response.content[:300]
    assert response["Content-Type"] == "application/json"
    assert response.json()["detail"]


# (name, content type, raw body, OpenAI error code)
FRONT_DOOR_BODIES = [
    ("invalid JSON", "application/json", b'{"model": "m", ', "invalid_json"),
    ("100k nested arrays", "application/json", nested(100_000).encode(), "invalid_json"),
    ("no model", "application/json", b'{"prompt": "x"}', "model_required"),
    ("JSON array", "application/json", b"[1, 2]", "model_required"),
    ("text/plain", "text/plain", b'{"model": "m"}', "model_required"),
    ("NUL in body", "application/json", b'{"model": "m", "x": "\\u0000"}', "invalid_body"),
    ("NaN in body", "application/json", b'{"model": "m", "temperature": NaN}', "invalid_body"),
    ("1e400 in body", "application/json", b'{"model": "m", "max_tokens": 1e400}', "invalid_body"),
    ("NUL in model", "application/json", b'{"model": "m\\u0000"}', "invalid_model"),
    (
        "nested 200 deep",
        "application/json",
        ('{"model": "m", "x": ' + nested(200) + "}").encode(),
        "invalid_body",
    ),
    (
        "NUL in a multipart model",
        "multipart/form-data; boundary=XX",
        b'--XX\r\nContent-Disposition: form-data; name="model"\r\n\r\nm\x00\r\n--XX--\r\n',
        "invalid_model",
    ),
    (
        # The job's column holds 200 characters: a 400 naming the field, not a 500.
        "300-character model",
        "application/json",
        json.dumps({"model": "m" * 300, "messages": []}).encode(),
        "invalid_model",
    ),
    (
        "300-character model in a form",
        "multipart/form-data; boundary=XX",
        b'--XX\r\nContent-Disposition: form-data; name="model"\r\n\r\n'
        + ("\u00e9" * 300).encode()
        + b"\r\n--XX--\r\n",
        "invalid_model",
    ),
]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("content_type", "raw", "code"),
    [case[1:] for case in FRONT_DOOR_BODIES],
    ids=[case[0] for case in FRONT_DOOR_BODIES],
)
def test_malformed_front_door_calls_get_openai_shaped_4xx(member, content_type, raw, code):
    _, token = member
    response = FrontDoorClient().post(
        FRONT_DOOR, data=raw, content_type=content_type, HTTP_AUTHORIZATION=f"Bearer {token}"
    )
    assert 400 <= response.status_code < 500, response.content[:300]
    error = response.json()["error"]
    assert error["code"] == code and error["message"], error
    if code in ("invalid_model", "model_required"):
        assert error["param"] == "model", error
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_a_front_door_model_no_gpu_serves_is_a_400_naming_model(member):
    """With several GPUs whose lists are known (one GPU's llama-swap decides alone)."""
    _, token = member
    for name in ("gpu0", "gpu1"):
        gpu = services.gpu_register(name=name, url=f"http://{name}.invalid:9")
        services.gpu_state_record(
            gpu_id=gpu.pk, reachable=True, resident_model=None, served_models=["chat-small"]
        )
    response = FrontDoorClient().post(
        FRONT_DOOR,
        data=json.dumps({"model": "\u00fc" * 200, "messages": []}),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )
    assert response.status_code == 400, response.content[:300]
    error = response.json()["error"]
    assert error["param"] == "model" and "no GPU serves" in error["message"], error
    assert not Job.objects.exists()


# (path, the setting of its limit, content type)
BODY_LIMITS = [
    ("/v1/chat/completions", "GPUSCHED_FRONT_DOOR_MAX_BODY_BYTES", "application/json"),
    ("/sdapi/v1/txt2img", "GPUSCHED_FRONT_DOOR_MAX_BODY_BYTES", "application/json"),
    ("/v1/audio/transcriptions", "GPUSCHED_FRONT_DOOR_MAX_UPLOAD_BYTES", "multipart/form-data"),
    ("/v1/images/edits", "GPUSCHED_FRONT_DOOR_MAX_UPLOAD_BYTES", "multipart/form-data"),
]


@pytest.mark.django_db
@pytest.mark.parametrize(("path", "setting", "content_type"), BODY_LIMITS)
def test_a_front_door_body_over_its_paths_limit_is_a_413_naming_the_setting(
    member, settings, path, setting, content_type
):
    """Each path's own limit (lowered here; the defaults take a base64 photo
    and a 25 MB audio file, tests/e2e/test_large_bodies.py), refused in
    OpenAI's shape before anything is queued."""
    _, token = member
    other = next(name for _, name, _ in BODY_LIMITS if name != setting)
    setattr(settings, setting, 1000)
    setattr(settings, other, 10 * MIB)
    response = FrontDoorClient().post(
        path,
        data=b"x" * 1001,
        content_type=f"{content_type}; boundary=XX",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )
    assert response.status_code == 413, response.content[:300]
    error = response.json()["error"]
    assert error["code"] == "request_too_large", error
    message = error["message"]
    assert "1001 bytes" in message and f"is 1000 bytes ({setting} raises it)" in message, error
    assert not Job.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("get", FRONT_DOOR, 405),
        ("post", "/v1/no/such/path", 404),
        ("post", "/sdapi/v1/nothing", 404),
    ],
)
def test_front_door_paths_and_methods_answer_in_openai_shape(member, method, path, status):
    _, token = member
    client = FrontDoorClient() if path == FRONT_DOOR else Client()
    response = getattr(client, method)(path, HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == status
    assert response.json()["error"]["message"]


# --- Against the real server ------------------------------------------------


def raw_exchange(port: int, request: bytes, *, half_close: bool = True) -> bytes:
    """Send raw bytes, read the answer until the server closes (or resets).
    `half_close`: then say the request is complete; without, this end stays
    open (a server that answers before the body ends reads a half-close as
    the client gone)."""
    answer = b""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        try:
            conn.sendall(request)
            # The server may have answered and closed already (ENOTCONN).
            if half_close:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_WR)
            while chunk := conn.recv(65536):
                answer += chunk
        except (ConnectionResetError, BrokenPipeError):
            pass  # the server refused and closed while the request was still arriving
    return answer


def status_of(answer: bytes) -> int | None:
    """The status code of a raw HTTP answer, None if the server sent none."""
    if not answer.startswith(b"HTTP/1."):
        return None
    return int(answer.split(b" ", 2)[1])


@pytest.mark.e2e
def test_the_server_refuses_huge_and_broken_requests(world):
    _, token = factories.member("mallory", "free")
    # The front door takes 32 MiB by default: lowered, so that 3 MiB is over it here.
    server = world.start_web(GPUSCHED_FRONT_DOOR_MAX_BODY_BYTES=str(2 * MIB))
    auth = {"Authorization": f"Bearer {token}"}
    checks: list[tuple[str, int | None]] = []

    with httpx.Client(base_url=server.url, timeout=30) as http:
        for path in (API, FRONT_DOOR):
            for name, body in [
                ("3 MiB body", json.dumps({"model": "m", "p": "a" * (3 * MIB)}).encode()),
                ("100k nested arrays", nested(100_000).encode()),
                ("invalid JSON", b'{"model": '),
            ]:
                answer = http.post(
                    path, content=body, headers={**auth, "Content-Type": "application/json"}
                )
                checks.append((f"{name} to {path}", answer.status_code))
                assert answer.text and answer.headers["content-type"] == "application/json"
        # A Host not in ALLOWED_HOSTS is refused before any view runs.
        checks.append(
            ("foreign Host", http.get("/api/health/", headers={"Host": "evil.example"}).status_code)
        )

    def request(path: str, *headers: bytes, body: bytes = b"") -> bytes:
        lines = [f"POST {path} HTTP/1.1".encode(), b"Host: 127.0.0.1", b"Connection: close"]
        lines += [f"Authorization: Bearer {token}".encode(), *headers]
        lines.append(f"Content-Length: {len(body)}".encode())
        return b"\r\n".join(lines) + b"\r\n\r\n" + body

    for path in (API, FRONT_DOOR):
        raw_cases = {
            # Over the 16 KiB limit, yet small enough for the server to read
            # whole: closing on unread bytes would reset the connection, and
            # the kernel would drop the 431 before this client reads it.
            "20 KiB header": request(path, b"X-LlamaSwap-Priority: " + b"1" * 20480),
            "600 headers": request(path, *(f"X-H{i}: a".encode() for i in range(600))),
            "NUL in a header": request(path, b"X-LlamaSwap-Priority: 1\x002"),
            "header without colon": request(path, b"Garbage"),
            "bad Content-Length": request(path, b"Content-Length: abc"),
        }
        for name, raw in raw_cases.items():
            answer = raw_exchange(server.port, raw)
            checks.append((f"{name} to {path}", status_of(answer)))
            if name == "20 KiB header":  # gpusched/server_limits.py: a 431 that says why
                assert b"longer than 16384 bytes" in answer, answer
        checks.append(
            (
                f"broken request line to {path}",
                status_of(raw_exchange(server.port, b"\x00\x01 / HTTP/1.1\r\n\r\n")),
            )
        )

    refused = [(name, status) for name, status in checks if not (status and 400 <= status < 500)]
    assert not refused, refused
    assert not Job.objects.exists()
    log = server.log_text()
    assert "Internal Server Error" not in log and '" 500 ' not in log


def answer_parts(port: int, request: bytes) -> tuple[int | None, dict]:
    """`raw_exchange` without a half-close: the answer's status and JSON body."""
    answer = raw_exchange(port, request, half_close=False)
    _, _, body = answer.partition(b"\r\n\r\n")
    return status_of(answer), json.loads(body) if body else {}


@pytest.mark.e2e
def test_the_server_refuses_a_body_over_its_paths_limit_before_storing_it(world):
    """gpusched/server_limits.py: at the headers when Content-Length says so
    (the 10 GB are never sent), while it arrives when chunked; in each door's
    own shape, and the server serves on."""
    _, token = factories.member("mallory", "free")
    server = world.start_web(GPUSCHED_FRONT_DOOR_MAX_BODY_BYTES="100000")

    def head(path: str, *headers: str) -> bytes:
        lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", f"Authorization: Bearer {token}"]
        lines += ["Content-Type: application/json", *headers]
        return ("\r\n".join(lines) + "\r\n\r\n").encode()

    ten_gb = "Content-Length: 10000000000"
    status, body = answer_parts(server.port, head(FRONT_DOOR, ten_gb))
    assert status == 413 and body["error"]["code"] == "request_too_large", body
    assert "GPUSCHED_FRONT_DOOR_MAX_BODY_BYTES raises it" in body["error"]["message"]
    status, body = answer_parts(server.port, head(API, ten_gb))
    assert status == 413 and "GPUSCHED_MAX_BODY_BYTES raises it" in body["detail"], body

    chunk = b"a" * 65536
    chunked = head(FRONT_DOOR, "Transfer-Encoding: chunked") + (
        (b"%x\r\n" % len(chunk) + chunk + b"\r\n") * 3 + b"0\r\n\r\n"
    )
    status, body = answer_parts(server.port, chunked)
    assert status == 413 and body["error"]["code"] == "request_too_large", body

    with httpx.Client(base_url=server.url, timeout=30) as http:
        assert http.get("/api/health/").status_code == 200
    assert not Job.objects.exists()


# --- WebSocket frames ---------------------------------------------------------

WEBSOCKET_FRAMES = [
    ("invalid JSON", {"text_data": '{"type": "auth", '}),
    ("binary frame", {"bytes_data": b"\x00\xff" * 100}),
    ("100k nested arrays", {"text_data": nested(100_000)}),
    ("JSON null", {"text_data": "null"}),
    ("1 MiB token", {"text_data": json.dumps({"type": "auth", "token": "a" * MIB})}),
]


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
@pytest.mark.parametrize(
    "frame", [case[1] for case in WEBSOCKET_FRAMES], ids=[case[0] for case in WEBSOCKET_FRAMES]
)
async def test_malformed_websocket_frames_get_an_error_message(default_tiers, frame):
    _, token = await database_sync_to_async(factories.member)("mallory", "free")
    communicator = WebsocketCommunicator(
        application, "/ws/queue/", headers=[(b"origin", b"http://127.0.0.1")]
    )
    try:
        assert (await communicator.connect())[0]
        assert (await communicator.receive_json_from())["type"] == "auth_required"
        await communicator.send_to(**frame)
        answer = await communicator.receive_json_from(timeout=5)
        assert answer["type"] == "error" and answer["message"], answer
        if "token" not in frame.get("text_data", ""):
            # Still open and still listening: a proper login goes through.
            await communicator.send_json_to({"type": "auth", "token": token})
            assert (await communicator.receive_json_from(timeout=5))["type"] == "snapshot"
        await communicator.disconnect()
    finally:
        await hub.stop()
        await database_sync_to_async(connections.close_all)()
