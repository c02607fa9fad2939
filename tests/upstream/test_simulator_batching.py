"""The llama-swap simulator as a batching server: per-model slots, over real HTTP."""

from __future__ import annotations

import argparse
import itertools
import json
import threading
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from gpusched.stack import wait_for
from queueapp.policy.occupancy import MAX_PARALLEL, batched_seconds
from queueapp.upstream.simulator import LlamaSwapSimulator, SimulatedGpu, cli

DEADLINE_S = 10.0
TIMING_TOLERANCE_S = 0.01  # time.time() at admission vs the monotonic clock of the hold
CHAT_PATH = "/v1/chat/completions"


def chat(model: str, user: str = "", **extra: Any) -> dict[str, Any]:
    body = {"model": model, "messages": [{"role": "user", "content": "hello"}], **extra}
    return {**body, "user": user} if user else body


class Together:
    """Requests sent from threads at the same moment, answers kept by label."""

    def __init__(self, sim: LlamaSwapSimulator) -> None:
        self.sim = sim
        self.answers: dict[str, httpx.Response] = {}
        self._threads: list[threading.Thread] = []

    def send(self, bodies: dict[str, dict[str, Any]]) -> None:
        barrier = threading.Barrier(len(bodies))

        def post(label: str, body: dict[str, Any]) -> None:
            barrier.wait(timeout=DEADLINE_S)
            self.answers[label] = httpx.post(
                f"{self.sim.url}{CHAT_PATH}", json=body, timeout=DEADLINE_S
            )

        for label, body in bodies.items():
            thread = threading.Thread(target=post, args=(label, body))
            thread.start()
            self._threads.append(thread)

    def join(self) -> None:
        """Every answer read, and every request's slot freed (the log has its status)."""
        for thread in self._threads:
            thread.join(timeout=DEADLINE_S)
        wait_for(
            lambda: all(entry["status"] is not None for entry in self.sim.log()),
            timeout=DEADLINE_S,
            message="every request's slot freed",
        )


def in_flight(sim: LlamaSwapSimulator) -> list[dict[str, Any]]:
    return [e for e in sim.log() if e["started_at"] is not None and e["status"] is None]


def wait_in_flight(sim: LlamaSwapSimulator, count: int) -> None:
    wait_for(
        lambda: len(in_flight(sim)) == count,
        timeout=DEADLINE_S,
        message=f"{count} requests in flight",
    )


def assert_models_never_overlap(log: list[dict[str, Any]]) -> None:
    admitted = [e for e in log if e["started_at"] is not None]
    for a, b in itertools.combinations(admitted, 2):
        if a["model"] != b["model"]:
            assert a["finished_at"] <= b["started_at"] or b["finished_at"] <= a["started_at"], (
                f"{a['model']} (seq {a['seq']}) and {b['model']} (seq {b['seq']}) overlap"
            )


def test_four_requests_of_one_model_share_the_gpu_and_a_fifth_is_refused(
    make_sim: Callable[..., LlamaSwapSimulator],
) -> None:
    sim = make_sim(models={"chat": 1.0}, initial_model="chat", parallel=4)
    together = Together(sim)
    together.send({f"r{i}": chat("chat", user=f"r{i}") for i in range(4)})
    try:
        wait_in_flight(sim, 4)
        fifth = httpx.post(f"{sim.url}{CHAT_PATH}", json=chat("chat", user="fifth"))
        assert fifth.status_code == 429
        assert fifth.json()["error"]["code"] == "concurrency_limit"
        assert 1 <= int(fifth.headers["Retry-After"]) <= 2
    finally:
        together.join()
    assert {label: a.status_code for label, a in together.answers.items()} == {
        f"r{i}": 200 for i in range(4)
    }
    log = sim.log()
    served = [e for e in log if e["status"] == 200]
    (refused,) = [e for e in log if e["status"] == 429]
    assert (refused["started_at"], refused["in_flight"], refused["run_seconds"]) == (None,) * 3
    assert sorted(e["in_flight"] for e in served) == [1, 2, 3, 4]
    for entry in served:
        assert entry["swapped"] is False and entry["load_seconds"] == 0
        assert entry["run_seconds"] == pytest.approx(batched_seconds(1.0, entry["in_flight"]))
        held = entry["finished_at"] - entry["started_at"]
        assert held >= entry["run_seconds"] - TIMING_TOLERANCE_S
    assert max(e["started_at"] for e in served) < min(e["finished_at"] for e in served)


def test_another_model_is_refused_while_the_resident_one_runs_then_swaps_in(
    make_sim: Callable[..., LlamaSwapSimulator],
) -> None:
    sim = make_sim(models={"chat": 0.5, "image": 0.05}, initial_model="chat", parallel=4)
    together = Together(sim)
    together.send({"a": chat("chat", user="a"), "b": chat("chat", user="b")})
    try:
        wait_in_flight(sim, 2)
        other = httpx.post(f"{sim.url}{CHAT_PATH}", json=chat("image", user="early"))
        assert other.status_code == 429
        assert int(other.headers["Retry-After"]) == 1
        assert [e["model"] for e in sim.running()["running"]] == ["chat"]
    finally:
        together.join()
    later = httpx.post(f"{sim.url}{CHAT_PATH}", json=chat("image", user="later"))
    assert later.status_code == 200
    wait_for(lambda: sim.log()[-1]["status"] == 200, message="the swapped request logged")
    swapped = sim.log()[-1]
    assert (swapped["model"], swapped["swapped"], swapped["in_flight"]) == ("image", True, 1)
    assert swapped["load_seconds"] == pytest.approx(0.1)
    assert swapped["run_seconds"] == pytest.approx(0.05)
    held = swapped["finished_at"] - swapped["started_at"]
    assert held >= 0.15 - TIMING_TOLERANCE_S  # the interval covers the load
    assert [e["model"] for e in sim.running()["running"]] == ["image"]
    assert_models_never_overlap(sim.log())


def test_per_model_parallel_overrides_the_default(
    make_sim: Callable[..., LlamaSwapSimulator],
) -> None:
    # Long enough that the probe below comes while all of them still run,
    # even on a busy machine (0.6 s once was not).
    sim = make_sim(
        models={"chat": 2.0, "image": 2.0},
        initial_model="chat",
        swap_seconds=0.0,
        parallel_models={"chat": 3},
    )
    assert (sim.gpu.parallel_for("chat"), sim.gpu.parallel_for("image")) == (3, 1)
    chats = Together(sim)
    chats.send({f"c{i}": chat("chat") for i in range(3)})
    try:
        wait_in_flight(sim, 3)
        assert httpx.post(f"{sim.url}{CHAT_PATH}", json=chat("chat")).status_code == 429
    finally:
        chats.join()
    images = Together(sim)
    images.send({"i0": chat("image")})
    try:
        wait_in_flight(sim, 1)
        assert httpx.post(f"{sim.url}{CHAT_PATH}", json=chat("image")).status_code == 429
    finally:
        images.join()
    log = sim.log()
    assert [(e["model"], e["status"]) for e in log].count(("chat", 200)) == 3
    assert [e["in_flight"] for e in log if e["model"] == "image"] == [1, None]
    assert_models_never_overlap(log)


def test_a_request_joining_a_starting_model_waits_for_the_rest_of_its_load(
    make_sim: Callable[..., LlamaSwapSimulator],
) -> None:
    sim = make_sim(models={"chat": 0.2}, swap_seconds=0.5, parallel=2)
    first = Together(sim)
    first.send({"first": chat("chat", user="first")})
    try:
        wait_for(
            lambda: (
                [(e["model"], e["state"]) for e in sim.running()["running"]]
                == [("chat", "starting")]
            ),
            timeout=DEADLINE_S,
            message="the cold load under way",
        )
        assert httpx.post(f"{sim.url}{CHAT_PATH}", json=chat("chat")).status_code == 200
    finally:
        first.join()
    swapper, joiner = sim.log()
    assert (swapper["swapped"], swapper["in_flight"]) == (True, 1)
    assert swapper["load_seconds"] == pytest.approx(0.5)
    assert (joiner["swapped"], joiner["in_flight"]) == (False, 2)
    assert 0 < joiner["load_seconds"] < 0.5
    # Both are ready to compute at the same moment: when the load ends.
    ready_at = swapper["started_at"] + swapper["load_seconds"]
    assert joiner["started_at"] + joiner["load_seconds"] == pytest.approx(ready_at, abs=1e-6)
    assert joiner["run_seconds"] == pytest.approx(batched_seconds(0.2, 2))
    assert joiner["finished_at"] >= ready_at + joiner["run_seconds"] - TIMING_TOLERANCE_S
    assert [e["state"] for e in sim.running()["running"]] == ["ready"]


def test_concurrent_streams_each_get_their_whole_event_stream(
    make_sim: Callable[..., LlamaSwapSimulator],
) -> None:
    sim = make_sim(models={"chat": 0.4}, initial_model="chat", parallel=3)
    received: dict[str, bytes] = {}
    barrier = threading.Barrier(3)

    def stream(user: str) -> None:
        barrier.wait(timeout=DEADLINE_S)
        body = chat("chat", user=user, stream=True)
        with httpx.stream(
            "POST", f"{sim.url}{CHAT_PATH}", json=body, timeout=DEADLINE_S
        ) as response:
            assert response.headers["content-type"].startswith("text/event-stream")
            received[user] = response.read()

    threads = [threading.Thread(target=stream, args=(f"s{i}",)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=DEADLINE_S)
    wait_for(
        lambda: [e["status"] for e in sim.log()] == [200] * 3, message="the three streams logged"
    )
    assert sorted(received) == ["s0", "s1", "s2"]
    ids = set()
    for user, raw in received.items():
        events = [part.removeprefix("data: ") for part in raw.decode().split("\n\n") if part]
        assert events[-1] == "[DONE]"
        chunks = [json.loads(event) for event in events[:-1]]
        assert len(chunks) >= 3
        assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
        assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
        assert "chat" in "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
        (answer_id,) = {c["id"] for c in chunks}  # one answer per stream, not interleaved
        ids.add(answer_id)
        (entry,) = [e for e in sim.log() if e["body"]["user"] == user]
        sent = sim.sent(entry["seq"])
        assert sent is not None and sent["body"] == raw
    assert len(ids) == 3
    log = sim.log()
    assert sorted(e["in_flight"] for e in log) == [1, 2, 3]
    assert max(e["started_at"] for e in log) < min(e["finished_at"] for e in log)


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["--parallel", "0"], "--parallel"),
        (["--parallel", str(MAX_PARALLEL + 1)], "--parallel"),
        (["--parallel", "x"], "--parallel"),
        (["--model-parallel", "chat"], "--model-parallel"),
        (["--model-parallel", "=2"], "--model-parallel"),
        (["--model-parallel", "chat=0"], "--model-parallel"),
        (["--model-parallel", "chat=two"], "--model-parallel"),
    ],
)
def test_cli_rejects_parallel_options_out_of_range(
    argv: list[str], option: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(argv)
    assert f"argument {option}" in capsys.readouterr().err


def test_cli_parallel_options_reach_the_simulator() -> None:
    argv = ["--port", "0", "--model", "chat=0.1", "--model", "image=0.1"]
    argv += ["--parallel", str(MAX_PARALLEL), "--model-parallel", "image=2"]
    sim = cli.simulator_from_args(cli.build_parser().parse_args(argv))
    assert (sim.gpu.parallel_for("chat"), sim.gpu.parallel_for("image")) == (MAX_PARALLEL, 2)
    defaults = cli.simulator_from_args(cli.build_parser().parse_args(["--model", "chat=0.1"]))
    assert defaults.gpu.parallel_for("chat") == 1
    unknown = cli.build_parser().parse_args(["--model", "chat=0.1", "--model-parallel", "nope=2"])
    with pytest.raises(ValueError, match="unknown model 'nope'"):
        cli.simulator_from_args(unknown)


def test_management_command_passes_parallel_options_through(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from queueapp.management.commands.simulate_llama_swap import Command

    received: list[argparse.Namespace] = []

    def run(args: argparse.Namespace) -> int:
        received.append(args)
        return 0

    monkeypatch.setattr(cli, "run", run)
    argv = ["--model", "chat=1", "--parallel", "4", "--model-parallel", "chat=8"]
    Command().run_from_argv(["manage.py", "simulate_llama_swap", *argv])
    (args,) = received
    assert (args.parallel, args.model_parallel) == (4, [("chat", 8)])


@pytest.mark.parametrize(
    "kwargs",
    [
        {"parallel": 0},
        {"parallel": MAX_PARALLEL + 1},
        {"parallel": 2.0},
        {"parallel_models": {"chat": 0}},
        {"parallel_models": {"nope": 2}},
    ],
)
def test_gpu_rejects_parallel_out_of_range(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        SimulatedGpu({"chat": 0.1}, **kwargs)
