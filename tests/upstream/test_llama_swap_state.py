"""What a llama-swap runs, read from `/running` and `/api/events` messages
(queueapp/upstream/llama_swap_state.py). The messages are llama-swap's own
shapes: internal/server/apigroup.go (the envelope, `event:message`),
internal/swaputil/events.go (InFlightRequestsEvent) and
internal/server/apigroup_test.go (an upsert carrying `req_headers`, a
redacted `Authorization`, a remove by id)."""

from __future__ import annotations

import json

import pytest

from queueapp.upstream.llama_swap_state import (
    LlamaSwapState,
    ModelsRunning,
    event_payload,
    resident_change,
    running_entries,
    server_sent_events,
)


def wire(kind: str, payload: object) -> str:
    """One message as llama-swap writes it: the payload encoded twice."""
    envelope = json.dumps({"type": kind, "data": json.dumps(payload)})
    return f"event:message\ndata:{envelope}\n\n"


def messages(text: str) -> list[tuple[str, object]]:
    found = []
    for event, data in server_sent_events(text.split("\n")):
        assert event == "message"
        decoded = event_payload(data)
        assert decoded is not None
        found.append(decoded)
    return found


def model_status(**states: str) -> list[dict[str, object]]:
    return [
        {
            "id": model,
            "name": "",
            "description": "",
            "state": state,
            "unlisted": False,
            "peerID": "",
        }
        for model, state in states.items()
    ]


def request(request_id: str, **headers: str) -> dict[str, object]:
    return {
        "id": request_id,
        "model": "chat",
        "req_path": "/v1/chat/completions",
        "method": "POST",
        "req_headers": {"User-Agent": "test-agent", "Authorization": "[REDACTED]", **headers},
        "resp_bytes": 0,
        "elapsed_ms": 0,
    }


def test_the_stream_is_read_into_messages_with_their_payload_decoded_twice():
    stream = wire("modelStatus", model_status(chat="ready")) + ": keep-alive\n\n"
    stream += wire("logData", {"source": "proxy", "data": "x"})
    assert messages(stream) == [
        ("modelStatus", model_status(chat="ready")),
        ("logData", {"source": "proxy", "data": "x"}),
    ]


@pytest.mark.parametrize("data", ["not json", "[]", '{"data": "{}"}', '{"type": "x", "data": "{"}'])
def test_a_message_that_is_not_llama_swaps_envelope_is_ignored(data):
    assert event_payload(data) is None


def test_model_states_follow_the_events_and_the_last_ready_model_is_the_latest():
    state = LlamaSwapState()
    assert state.event("modelStatus", model_status(chat="ready", tts="starting", big="stopped"))
    assert state.reading() == ModelsRunning(
        ready=("chat",), loading=("tts",), latest_ready="chat", foreign_in_flight=0
    )
    assert state.event("modelStatus", model_status(chat="ready", tts="ready", big="stopped"))
    assert state.reading().ready == ("chat", "tts")
    assert state.reading().latest_ready == "tts"
    # The same reading again changes nothing.
    assert not state.event("modelStatus", model_status(chat="ready", tts="ready", big="stopped"))
    # An unload: stopping, then stopped.
    assert state.event("modelStatus", model_status(chat="ready", tts="stopping", big="stopped"))
    assert state.reading() == ModelsRunning(
        ready=("chat",), loading=(), latest_ready="chat", foreign_in_flight=0
    )


def test_a_running_read_replaces_what_dropped_events_left_behind():
    state = LlamaSwapState()
    state.event("modelStatus", model_status(chat="ready"))
    # The unload's events were dropped; /running no longer lists the model.
    answer = {"running": [{"model": "tts", "state": "ready", "cmd": "x", "ttl": 0}]}
    assert state.running_read(running_entries(answer))
    assert state.reading().ready == ("tts",)
    assert state.reading().latest_ready == "tts"


@pytest.mark.parametrize("answer", [None, [], {"running": None}, {"running": "chat"}])
def test_a_running_answer_of_another_shape_is_refused(answer):
    with pytest.raises(ValueError):
        running_entries(answer)


def test_requests_without_gpuscheds_header_are_foreign_load():
    state = LlamaSwapState()
    snapshot = {"operation": "snapshot", "requests": [request("1"), request("2")]}
    assert state.event("inflight", snapshot)
    assert state.reading().foreign_in_flight == 2
    ours = request("3", **{"X-Gpusched-Job-Id": "17"})
    assert not state.event("inflight", {"operation": "upsert", "request": ours})
    assert state.event("inflight", {"operation": "remove", "id": "1"})
    assert state.reading().foreign_in_flight == 1
    # An upsert of a request already known (its bytes grew) counts it once.
    assert not state.event("inflight", {"operation": "upsert", "request": request("2")})
    assert state.reading().foreign_in_flight == 1
    # The header's case does not matter.
    lower = request("4", **{"x-gpusched-job-id": "18"})
    assert not state.event("inflight", {"operation": "upsert", "request": lower})
    # A lost stream forgets them; the next snapshot says them again.
    assert state.stream_lost()
    assert state.reading().foreign_in_flight == 0


def test_a_peer_llama_swaps_models_are_not_this_gpus():
    state = LlamaSwapState()
    peer = {"id": "peer/chat", "state": "ready", "peerID": "peer"}
    state.event("modelStatus", [*model_status(tts="ready"), peer])
    assert state.reading().ready == ("tts",)


@pytest.mark.parametrize(
    ("before", "after", "words"),
    [
        (["tts-kokoro"], ["image-xl"], "loaded image-xl, unloaded tts-kokoro"),
        ([], ["chat-small"], "loaded chat-small"),
        (["chat-small", "embed-small"], ["embed-small"], "unloaded chat-small"),
        (["a"], ["a", "c", "b"], "loaded b and c"),
        (["a", "b", "c"], [], "unloaded a, b and c"),
        (["a", "b"], ["b", "a"], None),
    ],
)
def test_a_resident_change_names_what_loaded_and_what_unloaded(before, after, words):
    assert resident_change(before, after) == words
