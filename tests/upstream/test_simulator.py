"""The llama-swap simulator, exercised over real HTTP on 127.0.0.1 with tiny durations."""

from __future__ import annotations

import base64
import json
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpusched.stack import wait_for
from queueapp.upstream.simulator import LlamaSwapSimulator, cli

ROOT = Path(__file__).resolve().parents[2]
DEADLINE_S = 5.0
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def chat(model: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hello"}], **extra}


def plain_get_seconds(sim: LlamaSwapSimulator) -> float:
    """How long the simulator takes to answer a plain GET /running now. A bound
    on a request's time adds five of these, so that it stretches with the load
    of a shared machine instead of failing under it."""
    t0 = time.monotonic()
    assert httpx.get(f"{sim.url}/running").status_code == 200
    return time.monotonic() - t0


def error_body(message: str, type_: str, code: str) -> dict[str, Any]:
    return {
        "src": "llama-swap",
        "error": {"message": message, "type": type_, "param": None, "code": code},
    }


def test_nothing_resident_initially_and_models_listed(client: httpx.Client) -> None:
    assert client.get("/running").json() == {"running": []}
    listing = client.get("/v1/models").json()
    assert listing["object"] == "list"
    assert [m["id"] for m in listing["data"]] == ["chat", "image"]
    for record in listing["data"]:
        assert record["object"] == "model"
        assert record["owned_by"] == "llama-swap"
        assert isinstance(record["created"], int)
        assert record["meta"] == {"llamaswap": {"type": "model"}}
        assert record["status"] == {"value": "unloaded"}
    health = client.get("/health")
    assert (health.status_code, health.text) == (200, "OK")


def test_served_model_becomes_resident_and_ready(client: httpx.Client) -> None:
    assert client.post("/v1/chat/completions", json=chat("chat")).status_code == 200
    assert client.get("/running").json() == {
        "running": [
            {
                "model": "chat",
                "state": "ready",
                "cmd": "llama-server --port 5800 --model chat.gguf",
                "proxy": "http://127.0.0.1:5800",
                "ttl": 0,
                "name": "chat",
                "description": "simulated by gpusched",
            }
        ]
    }
    statuses = {m["id"]: m["status"]["value"] for m in client.get("/v1/models").json()["data"]}
    assert statuses == {"chat": "loaded", "image": "unloaded"}


def test_initial_model_is_resident(make_sim: Callable[..., LlamaSwapSimulator]) -> None:
    sim = make_sim(initial_model="image")
    assert [e["model"] for e in httpx.get(f"{sim.url}/running").json()["running"]] == ["image"]


def test_chat_completion_shape_is_deterministic(client: httpx.Client) -> None:
    first = client.post("/v1/chat/completions", json=chat("chat")).json()
    second = client.post("/v1/chat/completions", json=chat("chat")).json()
    assert first["object"] == "chat.completion"
    assert first["model"] == "chat"
    assert first["choices"][0]["index"] == 0
    assert first["choices"][0]["message"]["role"] == "assistant"
    assert first["choices"][0]["finish_reason"] == "stop"
    assert set(first["usage"]) == {"prompt_tokens", "completion_tokens", "total_tokens"}
    content = first["choices"][0]["message"]["content"]
    assert "chat" in content and "#1" in content
    assert "#2" in second["choices"][0]["message"]["content"]


def test_swap_costs_time_and_is_logged(make_sim: Callable[..., LlamaSwapSimulator]) -> None:
    sim = make_sim(swap_seconds=0.4)
    with httpx.Client(base_url=sim.url, timeout=10) as c:
        elapsed, plain = [], []
        for model in ("chat", "chat", "image"):
            plain.append(plain_get_seconds(sim))
            t0 = time.monotonic()
            assert c.post("/v1/chat/completions", json=chat(model)).status_code == 200
            elapsed.append(time.monotonic() - t0)
    assert elapsed[0] >= 0.44
    assert elapsed[1] < 0.4 + 5 * plain[1]  # no swap for the resident model
    assert elapsed[2] >= 0.44
    assert [e["swapped"] for e in sim.log()] == [True, False, True]


def test_running_shows_starting_during_swap(make_sim: Callable[..., LlamaSwapSimulator]) -> None:
    sim = make_sim(swap_seconds=1.0)
    worker = threading.Thread(
        target=httpx.post, args=(f"{sim.url}/v1/chat/completions",), kwargs={"json": chat("chat")}
    )
    worker.start()
    try:
        states = lambda: [(e["model"], e["state"]) for e in sim.running()["running"]]  # noqa: E731
        wait_for(lambda: states() == [("chat", "starting")])
        over_http = httpx.get(f"{sim.url}/running").json()["running"]
        assert [(e["model"], e["state"]) for e in over_http] == [("chat", "starting")]
        wait_for(lambda: states() == [("chat", "ready")])
    finally:
        worker.join(timeout=DEADLINE_S)


def test_concurrent_request_is_refused_with_429(
    make_sim: Callable[..., LlamaSwapSimulator],
) -> None:
    sim = make_sim(models={"slow": 2.0, "chat": 0.05}, swap_seconds=0.0)
    results: dict[str, httpx.Response] = {}
    worker = threading.Thread(
        target=lambda: results.setdefault(
            "first", httpx.post(f"{sim.url}/v1/chat/completions", json=chat("slow"), timeout=10)
        )
    )
    worker.start()
    try:
        wait_for(lambda: any(e["started_at"] and e["status"] is None for e in sim.log()))
        second = httpx.post(f"{sim.url}/v1/chat/completions", json=chat("chat"))
        assert second.status_code == 429
        assert 1 <= int(second.headers["Retry-After"]) <= 2
        assert second.json() == error_body(
            "Too many requests", "rate_limit_error", "concurrency_limit"
        )
        # The simulator logs an answer's status once it has written it, so
        # the client may read the answer first: wait for the log, not once.
        wait_for(
            lambda: (
                [(e["model"], e["status"]) for e in httpx.get(f"{sim.url}/sim/log").json()]
                == [("slow", None), ("chat", 429)]
            ),
            message="the refusal logged while the first request runs",
        )
    finally:
        worker.join(timeout=DEADLINE_S)
    assert results["first"].status_code == 200
    wait_for(lambda: [e["status"] for e in sim.log()] == [200, 429], message="both answers logged")


def test_client_hang_up_frees_the_gpu(make_sim: Callable[..., LlamaSwapSimulator]) -> None:
    sim = make_sim(models={"slow": 30.0, "chat": 0.05}, swap_seconds=0.0)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{sim.url}/v1/chat/completions", json=chat("slow"), timeout=0.3)
    wait_for(lambda: sim.log()[0]["status"] == 499)
    plain = plain_get_seconds(sim)
    t0 = time.monotonic()
    assert httpx.post(f"{sim.url}/v1/chat/completions", json=chat("chat")).status_code == 200
    assert time.monotonic() - t0 < 5 + 5 * plain  # not after the slow job's 30 s


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/images/generations", {"model": "render", "prompt": "a fox"}),
        ("/v1/audio/speech", {"model": "render", "input": "hello", "voice": "alloy"}),
        ("/sdapi/v1/txt2img", {"model": "render", "prompt": "a fox"}),
    ],
    ids=["images", "speech", "sdapi"],
)
def test_a_render_whose_client_hung_up_runs_to_its_end(
    make_sim: Callable[..., LlamaSwapSimulator], path: str, body: dict[str, Any]
) -> None:
    """As image and audio servers do: the GPU stays busy until the render
    ends, and the log shows the request ending then, with the client gone."""
    sim = make_sim(models={"render": 2.0, "chat": 0.05}, swap_seconds=0.0)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{sim.url}{path}", json=body, timeout=0.2)
    # On a busy machine the client can give up before the render was given
    # the GPU: the next request must come after it was.
    wait_for(
        lambda: (log := sim.log()) and log[0]["started_at"] is not None,
        message="the render to start",
    )
    busy = httpx.post(f"{sim.url}/v1/chat/completions", json=chat("chat"))
    assert busy.status_code == 429  # the render still holds the GPU
    (render, refused) = wait_for(
        lambda: (log := sim.log())[0]["status"] is not None and log,
        message="the render to end",
    )
    assert (render["status"], refused["status"]) == (499, 429)
    assert render["finished_at"] >= render["started_at"] + render["run_seconds"]
    assert refused["received_at"] < render["finished_at"]


def test_unknown_model_gets_llama_swap_404(client: httpx.Client) -> None:
    response = client.post("/v1/chat/completions", json=chat("no-such-model"))
    assert response.status_code == 404
    assert response.json() == error_body(
        "no router for requested model", "invalid_request_error", "not_found"
    )


def test_accept_any_model_serves_unknown_models(
    make_sim: Callable[..., LlamaSwapSimulator],
) -> None:
    sim = make_sim(accept_any_model=True, default_seconds=0.01)
    response = httpx.post(f"{sim.url}/v1/chat/completions", json=chat("whatever"))
    assert response.status_code == 200
    assert response.json()["model"] == "whatever"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"json": {"messages": []}},
        {"json": {"model": ""}},
        {"content": b"{not json", "headers": {"Content-Type": "application/json"}},
        {"content": json.dumps(chat("chat")).encode()},  # JSON without a JSON Content-Type
    ],
    ids=["absent", "empty", "invalid-json", "no-content-type"],
)
def test_missing_model_gets_llama_swap_404(client: httpx.Client, kwargs: dict[str, Any]) -> None:
    response = client.post("/v1/chat/completions", **kwargs)
    assert response.status_code == 404
    assert response.json() == error_body(
        "no model id could be identified", "invalid_request_error", "not_found"
    )
    assert client.get("/sim/log").json()[-1]["status"] == 404


def test_plain_text_error_when_client_asks_for_it(client: httpx.Client) -> None:
    response = client.post("/v1/chat/completions", json={}, headers={"Accept": "text/plain"})
    assert response.status_code == 404
    assert response.text == "llama-swap: no model id could be identified"


def test_streaming_sends_chunks_over_the_job_time(
    make_sim: Callable[..., LlamaSwapSimulator],
) -> None:
    sim = make_sim(models={"chat": 0.8}, swap_seconds=0.0)
    events: list[tuple[float, str]] = []
    t0 = time.monotonic()
    with httpx.stream(
        "POST", f"{sim.url}/v1/chat/completions", json=chat("chat", stream=True), timeout=10
    ) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("data: "):
                events.append((time.monotonic() - t0, line.removeprefix("data: ")))
    assert events[-1][1] == "[DONE]"
    chunks = [json.loads(data) for _, data in events[:-1]]
    assert len(chunks) >= 3
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == "chat" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert "chat" in text
    # The first chunk is not held back until the job ends: it came at least
    # half the job's 0.8 s before the last, however slow the machine.
    assert events[0][0] < events[-1][0] - 0.4
    assert events[-1][0] >= 0.75


def test_streaming_completions_use_text_completion_chunks(client: httpx.Client) -> None:
    with client.stream(
        "POST", "/v1/completions", json={"model": "chat", "prompt": "hi", "stream": True}
    ) as response:
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    assert len(chunks) >= 3
    assert {c["object"] for c in chunks} == {"text_completion"}
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_sim_status_answers_with_an_error(client: httpx.Client) -> None:
    response = client.post("/v1/chat/completions", json=chat("chat", sim={"status": 503}))
    assert response.status_code == 503
    assert response.json() == error_body(
        "simulated upstream error", "server_error", "service_unavailable"
    )
    assert client.get("/sim/log").json()[-1]["status"] == 503


def test_sim_seconds_overrides_duration(client: httpx.Client) -> None:
    client.post("/v1/chat/completions", json=chat("chat"))  # make "chat" resident
    t0 = time.monotonic()
    response = client.post("/v1/chat/completions", json=chat("chat", sim={"seconds": 0.4}))
    assert response.status_code == 200
    assert time.monotonic() - t0 >= 0.39


def test_sim_size_bytes_pads_the_answer(client: httpx.Client) -> None:
    response = client.post("/v1/chat/completions", json=chat("chat", sim={"size_bytes": 200_000}))
    assert len(response.content) >= 200_000
    assert int(response.headers["Content-Length"]) == len(response.content)
    assert response.json()["object"] == "chat.completion"


def test_invalid_sim_object_is_rejected(client: httpx.Client) -> None:
    response = client.post("/v1/chat/completions", json=chat("chat", sim={"seconds": "slow"}))
    assert response.status_code == 400
    assert response.json()["src"] == "llama-swap"


@pytest.mark.parametrize("path", ["/sdapi/v1/txt2img", "/sdapi/v1/img2img"])
def test_sdapi_takes_the_model_from_the_json_body(client: httpx.Client, path: str) -> None:
    response = client.post(path, json={"model": "image", "prompt": "a cat", "steps": 4})
    assert response.status_code == 200
    body = response.json()
    assert base64.b64decode(body["images"][0]).startswith(PNG_SIGNATURE)
    assert body["parameters"]["steps"] == 4
    assert json.loads(body["info"])["model"] == "image"
    assert client.get("/sim/log").json()[-1]["model"] == "image"


def test_multipart_transcription_takes_the_model_from_the_form(client: httpx.Client) -> None:
    response = client.post(
        "/v1/audio/transcriptions",
        files={"file": ("clip.wav", b'RIFF\x00\x00name="model"', "audio/wav")},
        data={"model": "image", "language": "en"},
    )
    assert response.status_code == 200
    assert "image" in response.json()["text"]
    entry = client.get("/sim/log").json()[-1]
    assert (entry["model"], entry["body"], entry["path"]) == (
        "image",
        None,
        "/v1/audio/transcriptions",
    )


def test_other_endpoints_answer_in_openai_shapes(client: httpx.Client) -> None:
    emb = client.post("/v1/embeddings", json={"model": "chat", "input": "hi"}).json()
    assert emb["object"] == "list" and emb["model"] == "chat"
    assert emb["data"][0]["object"] == "embedding" and emb["data"][0]["index"] == 0
    assert len(emb["data"][0]["embedding"]) == 8
    assert all(isinstance(x, float) for x in emb["data"][0]["embedding"])

    img = client.post("/v1/images/generations", json={"model": "image", "prompt": "x"}).json()
    assert isinstance(img["created"], int)
    assert base64.b64decode(img["data"][0]["b64_json"]).startswith(PNG_SIGNATURE)

    edit = client.post(
        "/v1/images/edits", files={"image": ("a.png", b"x")}, data={"model": "image"}
    )
    assert edit.status_code == 200 and "b64_json" in edit.json()["data"][0]

    speech = client.post("/v1/audio/speech", json={"model": "chat", "input": "hi"})
    assert speech.headers["content-type"] in ("audio/wav", "audio/mpeg")
    assert speech.content.startswith(b"RIFF")

    cmpl = client.post("/v1/completions", json={"model": "chat", "prompt": "hi"}).json()
    assert cmpl["object"] == "text_completion" and "chat" in cmpl["choices"][0]["text"]

    resp = client.post("/v1/responses", json={"model": "chat", "input": "hi"}).json()
    assert resp["object"] == "response" and resp["status"] == "completed"
    assert resp["output"][0]["content"][0]["type"] == "output_text"


def test_unrouted_paths_answer_like_go_servemux(client: httpx.Client) -> None:
    assert client.get("/nope").status_code == 404
    assert client.get("/v1/chat/completions").status_code == 405
    assert client.get("/sim/log").json() == []


def test_log_records_arrival_order_and_reset_keeps_resident(
    sim: LlamaSwapSimulator, client: httpx.Client
) -> None:
    client.post("/v1/chat/completions", json=chat("chat"))
    client.post("/v1/embeddings", json={"model": "image", "input": "x"})
    log = client.get("/sim/log").json()
    assert log == sim.log()
    assert [(e["seq"], e["path"], e["model"]) for e in log] == [
        (1, "/v1/chat/completions", "chat"),
        (2, "/v1/embeddings", "image"),
    ]
    assert log[0]["body"] == chat("chat")
    for entry in log:
        assert entry["received_at"] <= entry["started_at"] <= entry["finished_at"]
        assert entry["in_flight"] == 1
    assert log[0]["finished_at"] <= log[1]["started_at"]
    assert client.post("/sim/reset").status_code == 200
    assert sim.log() == []
    assert [e["model"] for e in client.get("/running").json()["running"]] == ["image"]


def test_on_request_callback_sees_each_finished_request(
    make_sim: Callable[..., LlamaSwapSimulator],
) -> None:
    seen: list[dict[str, Any]] = []
    sim = make_sim(on_request=seen.append)
    httpx.post(f"{sim.url}/v1/chat/completions", json=chat("chat"))
    # Told as the slot frees, which may come just after the client has the answer.
    wait_for(lambda: seen, message="the request's callback")
    assert [(e["model"], e["status"]) for e in seen] == [("chat", 200)]


def _read_lines(stream: Any, sink: queue.Queue[str]) -> None:
    for line in stream:
        sink.put(line)


@pytest.mark.e2e  # starts a process
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_cli_prints_listening_line_and_exits_cleanly(signum: int) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "queueapp.upstream.simulator", "--port", "0"]
        + ["--model", "chat=0.01", "--swap-seconds", "0"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=_read_lines, args=(proc.stdout, lines), daemon=True).start()
    try:
        first = lines.get(timeout=DEADLINE_S)
        assert first.startswith("llama-swap simulator listening on http://127.0.0.1:")
        url = first.split(" on ", 1)[1].strip()
        assert httpx.post(f"{url}/v1/chat/completions", json=chat("chat")).status_code == 200
        record = json.loads(lines.get(timeout=DEADLINE_S))
        assert (record["model"], record["status"], record["swapped"]) == ("chat", 200, True)
        proc.send_signal(signum)
        assert proc.wait(timeout=DEADLINE_S) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_cli_rejects_malformed_model_option() -> None:
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["--model", "no-seconds"])


def test_management_command_passes_options_through(monkeypatch: pytest.MonkeyPatch) -> None:
    from queueapp.management.commands.simulate_llama_swap import Command

    received: list[Any] = []
    monkeypatch.setattr(cli, "run", lambda args: received.append(args) or 0)
    argv = ["--host", "0.0.0.0", "--port", "9393", "--model", "chat-small=0.2"]
    argv += ["--model", "image-xl=20", "--swap-seconds", "2", "--accept-any-model"]
    Command().run_from_argv(["manage.py", "simulate_llama_swap", *argv])
    (args,) = received
    assert (args.host, args.port, args.swap_seconds) == ("0.0.0.0", 9393, 2.0)
    assert args.model == [("chat-small", 0.2), ("image-xl", 20.0)]
    assert (args.accept_any_model, args.default_seconds, args.initial_model) == (True, 1.0, None)
