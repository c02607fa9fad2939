"""The simulator's process states in ``/running``, llama-swap's unload routes, what an
unload does to the requests in flight on its model, and ``ttl``, over real HTTP."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import pytest

from gpusched.stack import wait_for
from queueapp.upstream.simulator import LlamaSwapSimulator, cli, error_envelope
from tests.upstream.helpers import DEADLINE_S, chat, in_background


def running(sim: LlamaSwapSimulator) -> list[tuple[str, str]]:
    entries = httpx.get(f"{sim.url}/running").json()["running"]
    return [(entry["model"], entry["state"]) for entry in entries]


def wait_running(sim: LlamaSwapSimulator, expected: list[tuple[str, str]]) -> None:
    wait_for(
        lambda: running(sim) == expected, timeout=DEADLINE_S, message=f"/running to be {expected}"
    )


def started(sim: LlamaSwapSimulator) -> bool:
    """Whether a request has been admitted (it holds a slot)."""
    return any(entry["started_at"] is not None for entry in sim.log())


# -- /running ----------------------------------------------------------------------------


def test_running_shows_a_load_starting_then_ready(
    make_sim: Callable[..., LlamaSwapSimulator],
) -> None:
    sim = make_sim(swap_seconds=1.0, ttl={"chat": 300})
    answer = in_background(
        lambda: httpx.post(f"{sim.url}/v1/chat/completions", json=chat("chat"), timeout=10)
    )
    wait_running(sim, [("chat", "starting")])
    wait_running(sim, [("chat", "ready")])
    assert answer().status_code == 200
    [entry] = httpx.get(f"{sim.url}/running").json()["running"]
    assert entry == {
        "model": "chat",
        "state": "ready",
        "cmd": "llama-server --port 5800 --model chat.gguf",
        "proxy": "http://127.0.0.1:5800",
        "ttl": 300,
        "name": "chat",
        "description": "simulated by gpusched",
    }
    listing = httpx.get(f"{sim.url}/v1/models").json()["data"]
    assert {record["id"]: record["status"]["value"] for record in listing} == {
        "chat": "loaded",
        "image": "unloaded",
    }
    assert {tuple(record) for record in listing} == {
        ("id", "object", "created", "owned_by", "meta", "status")
    }


def test_an_unload_shows_stopping_then_nothing(
    make_sim: Callable[..., LlamaSwapSimulator],
) -> None:
    sim = make_sim(initial_model="chat", stop_seconds=1.0)
    unload = in_background(lambda: httpx.post(f"{sim.url}/api/models/unload/chat", timeout=10))
    wait_running(sim, [("chat", "stopping")])
    # While it stops, a request is refused, as the simulator refuses what finds no slot.
    busy = httpx.post(f"{sim.url}/v1/chat/completions", json=chat("chat"))
    assert (busy.status_code, busy.headers["retry-after"]) == (429, "1")
    wait_running(sim, [])
    answer = unload()
    assert (answer.status_code, answer.text) == (200, "OK")
    assert answer.headers["content-type"] == "text/plain; charset=utf-8"
    listing = httpx.get(f"{sim.url}/v1/models").json()["data"]
    statuses = {m["id"]: m["status"]["value"] for m in listing}
    assert statuses == {"chat": "unloaded", "image": "unloaded"}


# -- the unload routes' answers ----------------------------------------------------------


def test_unload_routes_answer_as_llama_swap(make_sim: Callable[..., LlamaSwapSimulator]) -> None:
    sim = make_sim(initial_model="image")
    with httpx.Client(base_url=sim.url, timeout=10) as client:
        unknown = client.post("/api/models/unload/nope")
        assert unknown.status_code == 404
        assert unknown.json() == error_envelope(404, "model not found")
        assert running(sim) == [("image", "ready")]
        not_resident = client.post("/api/models/unload/chat")
        assert (not_resident.status_code, not_resident.text) == (200, "OK")
        assert running(sim) == [("image", "ready")]
        everything = client.post("/api/models/unload")
        assert everything.status_code == 200
        assert everything.headers["content-type"] == "application/json"
        assert everything.content == b'{"msg":"ok"}\n'
        assert running(sim) == []
        assert client.post("/v1/chat/completions", json=chat("chat")).status_code == 200
        legacy = client.get("/unload")
        assert (legacy.status_code, legacy.text) == (200, "OK")
        assert running(sim) == []
        wrong_method = client.get("/api/models/unload/chat")
        assert (wrong_method.status_code, wrong_method.headers["allow"]) == (405, "POST")


# -- what an unload does to the requests in flight ---------------------------------------


def test_unload_cuts_a_request_being_computed_with_an_empty_502(
    make_sim: Callable[..., LlamaSwapSimulator],
) -> None:
    sim = make_sim(initial_model="chat")
    t0 = time.monotonic()
    answer = in_background(
        lambda: httpx.post(
            f"{sim.url}/v1/chat/completions", json=chat("chat", sim={"seconds": 30}), timeout=40
        )
    )
    wait_for(lambda: started(sim), timeout=DEADLINE_S, message="the request to be admitted")
    assert httpx.post(f"{sim.url}/api/models/unload/chat").status_code == 200
    cut = answer()
    assert time.monotonic() - t0 < 10
    assert (cut.status_code, cut.content) == (502, b"")
    assert "content-type" not in cut.headers
    wait_for(
        lambda: [entry["status"] for entry in sim.log()] == [502],
        timeout=DEADLINE_S,
        message="the cut request to be logged with its 502",
    )
    # The killed server freed the GPU: the next request is served at once.
    assert httpx.post(f"{sim.url}/v1/chat/completions", json=chat("chat")).status_code == 200


def test_unload_answers_a_request_waiting_for_the_load_with_a_500(
    make_sim: Callable[..., LlamaSwapSimulator],
) -> None:
    sim = make_sim(swap_seconds=30)
    answer = in_background(
        lambda: httpx.post(f"{sim.url}/v1/chat/completions", json=chat("chat"), timeout=40)
    )
    wait_running(sim, [("chat", "starting")])
    assert httpx.post(f"{sim.url}/api/models/unload").status_code == 200
    cut = answer()
    assert cut.status_code == 500
    assert cut.json() == error_envelope(500, "unspecific error: group: model unloaded")
    assert running(sim) == []


def test_unload_ends_a_stream_early_without_done(
    make_sim: Callable[..., LlamaSwapSimulator],
) -> None:
    sim = make_sim(initial_model="chat")
    body = chat("chat", stream=True, sim={"seconds": 30})
    lines: list[str] = []
    unload: Callable[[], httpx.Response] | None = None
    with (
        httpx.Client(timeout=40) as client,
        client.stream("POST", f"{sim.url}/v1/chat/completions", json=body) as stream,
    ):
        assert stream.status_code == 200
        for line in stream.iter_lines():
            lines.append(line)
            if len(lines) == 1:  # the first event is out: now unload
                unload = in_background(lambda: httpx.post(f"{sim.url}/api/models/unload"))
    assert unload is not None and unload().status_code == 200
    events = [line for line in lines if line]
    assert events and events[0].startswith("data: {")
    assert "data: [DONE]" not in events
    # Logged as it ends, which may be just after the client read the last chunk.
    wait_for(
        lambda: [entry["status"] for entry in sim.log()] == [200],
        timeout=DEADLINE_S,
        message="the stream to be logged with its 200",
    )


# -- ttl -----------------------------------------------------------------------------------


def test_ttl_unloads_an_idle_model_counted_from_its_last_request(
    make_sim: Callable[..., LlamaSwapSimulator],
) -> None:
    sim = make_sim(ttl={"chat": 1})
    # A request longer than the ttl is not cut: the model is in use, not idle.
    slow = httpx.post(
        f"{sim.url}/v1/chat/completions", json=chat("chat", sim={"seconds": 1.5}), timeout=10
    )
    ended = time.monotonic()
    assert slow.status_code == 200
    assert running(sim) == [("chat", "ready")]
    wait_running(sim, [])
    assert time.monotonic() - ended >= 1.0


# -- the command line ----------------------------------------------------------------------


def test_cli_options_reach_the_simulator() -> None:
    argv = ["--port", "0", "--model", "chat=0.1", "--ttl", "chat=30"]
    argv += ["--stop-seconds", "0.5", "--no-events"]
    sim = cli.simulator_from_args(cli.build_parser().parse_args(argv))
    assert sim.gpu.processes["chat"].ttl == 30
    assert (sim.gpu.stop_seconds, sim.events_enabled) == (0.5, False)
    defaults = cli.simulator_from_args(cli.build_parser().parse_args(["--model", "chat=0.1"]))
    assert (defaults.gpu.processes["chat"].ttl, defaults.events_enabled) == (0, True)
    unknown = cli.build_parser().parse_args(["--model", "chat=0.1", "--ttl", "nope=5"])
    with pytest.raises(ValueError, match="unconfigured model 'nope'"):
        cli.simulator_from_args(unknown)


@pytest.mark.parametrize("value", ["chat", "chat=1.5", "chat=-1", "=3"])
def test_cli_rejects_a_ttl_that_is_not_whole_seconds(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["--ttl", value])
    assert "argument --ttl" in capsys.readouterr().err
