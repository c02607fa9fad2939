"""The simulator's ``GET /api/events`` over real HTTP: llama-swap's framing, its connect
payload, ``modelStatus`` on state changes, ``inflight`` records with the request headers,
and the simulator-only switch that drops events."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from queueapp.upstream.simulator import LlamaSwapSimulator
from queueapp.upstream.simulator.events import go_json
from queueapp.upstream.simulator.inflight import go_header_key, go_timestamp, header_map
from tests.upstream.helpers import EventStream, chat, in_background

JOB_HEADER = "X-Gpusched-Job-Id"
OpenEvents = Callable[[LlamaSwapSimulator], EventStream]


def model_states(event: dict[str, Any]) -> dict[str, str]:
    assert event["type"] == "modelStatus"
    return {record["id"]: record["state"] for record in event["data"]}


def statuses(event: dict[str, Any]) -> dict[str, str] | None:
    """The states a ``modelStatus`` event carries; None for other events."""
    return model_states(event) if event["type"] == "modelStatus" else None


def is_status(**states: str) -> Callable[[dict[str, Any]], bool]:
    def matches(event: dict[str, Any]) -> bool:
        if event["type"] != "modelStatus":
            return False
        current = model_states(event)
        return all(current[model] == state for model, state in states.items())

    return matches


# -- the wire format --------------------------------------------------------------------


def test_connect_sends_llama_swaps_payload_framed_as_it_frames_it(
    sim: LlamaSwapSimulator, open_events: OpenEvents
) -> None:
    stream = open_events(sim)
    assert stream.response is not None
    headers = stream.response.headers
    assert headers["content-type"] == "text/event-stream"
    assert (headers["cache-control"], headers["x-accel-buffering"]) == ("no-cache", "no")
    assert headers["x-content-type-options"] == "nosniff"
    frames = [stream.next() for _ in range(6)]
    # Byte for byte: no space after the colons, the payload JSON inside a JSON string.
    assert frames[0][0] == (
        b'event:message\ndata:{"type":"logData","data":"{\\"source\\":\\"proxy\\",'
        b'\\"data\\":\\"\\"}"}\n\n'
    )
    assert [event["type"] for _, event in frames] == [
        "logData",
        "logData",
        "modelStatus",
        "uiConfig",
        "profileChanged",
        "inflight",
    ]
    status = frames[2][1]["data"]
    assert status == [
        {
            "id": name,
            "name": name,
            "description": "simulated by gpusched",
            "state": "stopped",
            "unlisted": False,
            "peerID": "",
        }
        for name in ("chat", "image")
    ]
    # Go's omitempty drops the empty list.
    assert frames[5][0] == (
        b'event:message\ndata:{"type":"inflight","data":"{\\"operation\\":\\"snapshot\\"}"}\n\n'
    )


def test_a_load_and_an_unload_send_every_state_change(
    make_sim: Callable[..., LlamaSwapSimulator], open_events: OpenEvents
) -> None:
    sim = make_sim(swap_seconds=0.2, stop_seconds=0.2, initial_model="image")
    stream = open_events(sim)
    assert model_states(stream.until(is_status(image="ready"))[-1]) == {
        "chat": "stopped",
        "image": "ready",
    }
    assert httpx.post(f"{sim.url}/v1/chat/completions", json=chat("chat")).status_code == 200
    changes = [statuses(e) for e in stream.until(is_status(chat="ready"))]
    assert [c for c in changes if c] == [
        {"chat": "stopped", "image": "stopping"},
        {"chat": "stopped", "image": "stopped"},
        {"chat": "starting", "image": "stopped"},
        {"chat": "ready", "image": "stopped"},
    ]
    assert httpx.post(f"{sim.url}/api/models/unload/chat").status_code == 200
    changes = [statuses(e) for e in stream.until(is_status(chat="stopped"))]
    assert [c for c in changes if c] == [
        {"chat": "stopping", "image": "stopped"},
        {"chat": "stopped", "image": "stopped"},
    ]


# -- inflight ----------------------------------------------------------------------------


def test_a_request_in_flight_is_upserted_with_its_headers_then_removed(
    sim: LlamaSwapSimulator, open_events: OpenEvents
) -> None:
    stream = open_events(sim)
    stream.until(lambda e: e["type"] == "inflight")  # the connect snapshot
    headers = {JOB_HEADER: "7", "Authorization": "Bearer secret", "cookie": "session=1"}
    answer = httpx.post(
        f"{sim.url}/v1/chat/completions", json=chat("chat"), headers=headers, timeout=10
    )
    assert answer.status_code == 200
    events = stream.until(lambda e: e["type"] == "inflight" and e["data"]["operation"] == "remove")
    upserts = [e["data"] for e in events if e["type"] == "inflight"][:-1]
    assert upserts and {u["operation"] for u in upserts} == {"upsert"}
    first = upserts[0]["request"]
    request_id = first["id"]
    assert events[-1]["data"] == {"operation": "remove", "id": request_id}
    assert list(first) == [
        "id",
        "timestamp",
        "model",
        "req_path",
        "method",
        "req_headers",
        "remote_ip",
        "resp_headers",
        "resp_bytes",
        "elapsed_ms",
    ]
    assert (first["model"], first["req_path"], first["method"]) == (
        "chat",
        "/v1/chat/completions",
        "POST",
    )
    assert first["remote_ip"] == "127.0.0.1"
    assert first["resp_headers"] == {}
    sent = first["req_headers"]
    assert sent[JOB_HEADER] == "7"
    assert (sent["Authorization"], sent["Cookie"]) == ("[REDACTED]", "[REDACTED]")
    assert "Host" not in sent and sent["Content-Type"] == "application/json"
    # Once the answer's headers are written, the record carries them too.
    last = upserts[-1]["request"]
    assert last["id"] == request_id
    assert last["resp_headers"]["Content-Type"] == "application/json"


def test_a_stream_opened_mid_request_gets_it_in_its_snapshot(
    sim: LlamaSwapSimulator, open_events: OpenEvents
) -> None:
    first = open_events(sim)
    answer = in_background(
        lambda: httpx.post(
            f"{sim.url}/v1/chat/completions",
            json=chat("chat", sim={"seconds": 1.0}),
            headers={JOB_HEADER: "7"},
            timeout=10,
        )
    )
    first.until(lambda e: e["type"] == "inflight" and e["data"]["operation"] == "upsert")
    late = open_events(sim)
    snapshot = late.until(lambda e: e["type"] == "inflight")[-1]["data"]
    assert snapshot["operation"] == "snapshot"
    [request] = snapshot["requests"]
    assert (request["model"], request["req_headers"][JOB_HEADER]) == ("chat", "7")
    assert answer().status_code == 200
    removed = late.until(lambda e: e["type"] == "inflight" and e["data"]["operation"] == "remove")
    assert removed[-1]["data"]["id"] == request["id"]


# -- the switch --------------------------------------------------------------------------


def test_with_events_off_the_stream_is_silent_while_running_changes(
    sim: LlamaSwapSimulator, client: httpx.Client, open_events: OpenEvents
) -> None:
    stream = open_events(sim)
    stream.until(lambda e: e["type"] == "inflight")
    assert client.post("/sim/events", json={"enabled": False}).json() == {"enabled": False}
    assert client.get("/sim/events").json() == {"enabled": False}
    assert client.post("/v1/chat/completions", json=chat("chat")).status_code == 200
    assert [e["state"] for e in client.get("/running").json()["running"]] == ["ready"]
    # Back on, the next change is the first thing the stream carries: the load's events
    # and the request's inflight records were dropped, not held back.
    assert client.post("/sim/events", json={"enabled": True}).json() == {"enabled": True}
    assert client.post("/api/models/unload/chat").status_code == 200
    _, event = stream.next()
    assert model_states(event) == {"chat": "stopping", "image": "stopped"}


def test_a_stream_opened_with_events_off_answers_and_sends_nothing(
    make_sim: Callable[..., LlamaSwapSimulator], open_events: OpenEvents
) -> None:
    sim = make_sim(events=False, initial_model="chat")
    assert not sim.events_enabled
    stream = open_events(sim)
    assert stream.response is not None and stream.response.status_code == 200
    assert httpx.post(f"{sim.url}/api/models/unload").json() == {"msg": "ok"}
    assert httpx.get(f"{sim.url}/running").json() == {"running": []}
    httpx.post(f"{sim.url}/sim/events", json={"enabled": True})
    assert httpx.post(f"{sim.url}/v1/chat/completions", json=chat("chat")).status_code == 200
    # Not the connect payload, not the unload: the request's record, then its load.
    events = stream.until(lambda e: e["type"] == "modelStatus")
    assert {e["type"] for e in events[:-1]} == {"inflight"}
    assert model_states(events[-1]) == {"chat": "starting", "image": "stopped"}


def test_the_switch_refuses_a_body_without_a_boolean(client: httpx.Client) -> None:
    answer = client.post("/sim/events", json={"enabled": "no"})
    assert answer.status_code == 400
    assert client.get("/sim/events").json() == {"enabled": True}


# -- Go's encodings, as the records use them ----------------------------------------------


@pytest.mark.parametrize(
    ("key", "canonical"),
    [
        ("x-gpusched-job-id", "X-Gpusched-Job-Id"),
        ("CONTENT-TYPE", "Content-Type"),
        ("x-api-key", "X-Api-Key"),
        ("bad key", "bad key"),  # not a token: Go leaves it as it is
    ],
)
def test_header_keys_take_gos_canonical_form(key: str, canonical: str) -> None:
    assert go_header_key(key) == canonical


def test_header_map_keeps_the_first_value_and_redacts_as_llama_swap() -> None:
    # llama-swap's internal/server/extras_test.go TestServer_HeaderMapAndRedact, as data.
    headers = [
        ("Content-Type", "application/json"),
        ("Authorization", "Bearer secret"),
        ("X-Api-Key", "key123"),
        ("proxy-authorization", "Basic x"),
        ("Set-Cookie", "a=1"),
        ("X-Tag", "first"),
        ("x-tag", "second"),
        ("Host", "127.0.0.1:9292"),
    ]
    assert header_map(headers, request=True) == {
        "Authorization": "[REDACTED]",
        "Content-Type": "application/json",
        "Proxy-Authorization": "[REDACTED]",
        "Set-Cookie": "[REDACTED]",
        "X-Api-Key": "[REDACTED]",
        "X-Tag": "first",
    }


def test_json_and_times_are_written_as_go_writes_them() -> None:
    assert go_json({"b": "<a&b>", "a": [1]}) == '{"b":"\\u003ca\\u0026b\\u003e","a":[1]}'
    seconds, zone = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", r"(Z|[+-]\d\d:\d\d)"
    assert re.fullmatch(seconds + zone, go_timestamp(1_700_000_000.0))
    assert re.fullmatch(seconds + r"\.5" + zone, go_timestamp(1_700_000_000.5))
