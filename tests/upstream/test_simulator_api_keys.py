"""The simulator's `apiKeys` check, as llama-swap's (internal/server/auth.go):
the open routes, the three ways to give a key, the 401 answer, and the
record of the credentials each request carried, which holds no value."""

from __future__ import annotations

import base64

import httpx
import pytest

from queueapp.upstream.client import LlamaSwapClient, UpstreamKeyRefused, key_refused
from queueapp.upstream.simulator.api_keys import ApiKeyGate

KEY = "sk-sim-key"
CHAT = {"model": "chat", "messages": [{"role": "user", "content": "hi"}]}


def basic(password: str, user: str = "anyone") -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_without_a_key_every_route_but_the_open_ones_is_refused_as_llama_swap_does(make_sim):
    sim = make_sim(api_keys=[KEY])
    with httpx.Client(base_url=sim.url) as http:
        for path in ["/running", "/v1/models", "/upstream/chat/"]:
            answer = http.get(path)
            assert answer.status_code == 401, path
            assert answer.headers["www-authenticate"] == 'Basic realm="llama-swap"'
            assert answer.json() == {
                "src": "llama-swap",
                "error": {
                    "message": "unauthorized: invalid or missing API key",
                    "type": "authentication_error",
                    "param": None,
                    "code": "unauthorized",
                },
            }
            assert key_refused(answer.status_code, answer.headers["www-authenticate"])
        # The body of a refused POST is read: the kept-alive connection goes on.
        assert http.post("/v1/chat/completions", json=CHAT).status_code == 401
        assert http.get("/health").status_code == 200
        plain = http.get("/running", headers={"Accept": "text/plain"})
        assert plain.text == "llama-swap: unauthorized: invalid or missing API key"
    assert sim.log() == []  # nothing reached the GPU


@pytest.mark.parametrize(
    "headers",
    [
        {"Authorization": f"Bearer {KEY}"},
        {"Authorization": f"bearer {KEY}"},
        {"Authorization": basic(KEY)},
        {"x-api-key": KEY},
    ],
)
def test_each_way_of_giving_the_key_is_accepted(make_sim, headers):
    sim = make_sim(api_keys=["other-key", KEY])
    answer = httpx.post(f"{sim.url}/v1/chat/completions", json=CHAT, headers=headers)
    assert answer.status_code == 200
    (seen,) = sim.api_keys.seen()
    assert seen["key_matched"] is True
    assert seen["credential_headers"] == sorted(name.lower() for name in headers)


def test_basic_wins_over_bearer_and_a_wrong_key_is_refused(make_sim):
    sim = make_sim(api_keys=[KEY])
    mixed = {"Authorization": basic("wrong"), "x-api-key": KEY}
    assert httpx.get(f"{sim.url}/running", headers=mixed).status_code == 401
    wrong = httpx.get(f"{sim.url}/running", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    seen = sim.api_keys.seen()
    assert [(s["key_from"], s["key_matched"]) for s in seen] == [
        ("basic", False),
        ("bearer", False),
    ]


def test_the_record_holds_header_names_never_their_values(make_sim):
    sim = make_sim(api_keys=[KEY])
    token = "member-token-123"
    headers = {"Authorization": f"Bearer {KEY}", "Cookie": f"session={token}", "x-api-key": token}
    httpx.get(f"{sim.url}/running", headers=headers)
    record = httpx.get(f"{sim.url}/sim/credentials").json()  # /sim/ needs no key
    assert record == sim.api_keys.seen()
    assert record[0]["credential_headers"] == ["authorization", "cookie", "x-api-key"]
    assert token not in str(record) and KEY not in str(record)


def test_without_keys_every_request_passes_and_is_still_recorded(make_sim):
    sim = make_sim()
    assert httpx.get(f"{sim.url}/running").status_code == 200
    assert sim.api_keys.seen()[0]["key_matched"] is None


def test_the_dispatchers_client_sends_the_key_and_names_a_refusal(make_sim):
    sim = make_sim(api_keys=[KEY])
    keyed = LlamaSwapClient(sim.url, job_timeout=5, auth_headers={"Authorization": f"Bearer {KEY}"})
    assert keyed.running_states() == {}
    assert keyed.forward("/v1/chat/completions", CHAT, job_id=1).status_code == 200
    assert keyed.preload("image", job_id=2).status_code == 200
    assert _first_events(keyed)[-1][0] == "inflight"
    assert {s["key_matched"] for s in sim.api_keys.seen()} == {True}
    for client, says in [
        (LlamaSwapClient(sim.url, job_timeout=5), "gpusched sends no key"),
        (
            LlamaSwapClient(sim.url, job_timeout=5, auth_headers={"Authorization": "Bearer x"}),
            "is not one of llama-swap's apiKeys",
        ),
    ]:
        for call in [
            client.running_states,
            client.served_models,
            lambda client=client: client.forward("/v1/chat/completions", CHAT, job_id=3),
            lambda client=client: client.preload("chat", job_id=4),
            lambda client=client: _first_events(client),
        ]:
            with pytest.raises(UpstreamKeyRefused, match="llama-swap refused the API key") as exc:
                call()
            assert says in str(exc.value) and KEY not in str(exc.value)


def _first_events(client: LlamaSwapClient) -> list[tuple[str, object]]:
    """The messages llama-swap sends on connect to /api/events, up to its
    in-flight snapshot (the last of them)."""
    messages = []
    for kind, payload in client.events(read_timeout=5):
        messages.append((kind, payload))
        if kind == "inflight":
            break
    return messages


def test_keys_are_checked_as_llama_swaps_config_loader_does():
    with pytest.raises(ValueError, match="apiKeys\\[1\\]: api key cannot contain spaces"):
        ApiKeyGate(["ok", "not ok"])
    with pytest.raises(ValueError, match="empty api key"):
        ApiKeyGate([""])


def test_only_llama_swaps_own_401_counts_as_a_refused_key():
    assert key_refused(401, 'Basic realm="llama-swap"')
    assert not key_refused(401, None)  # a model server's own 401, relayed
    assert not key_refused(403, 'Basic realm="llama-swap"')
