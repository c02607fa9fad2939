"""The simulator's slots as a real llama-server's: read from the config's ``cmd`` and
``env`` (``-np 3``) unless ``--model-parallel`` says otherwise, and reported at
``/upstream/<model>/props`` (``total_slots``), which gpusched's client reads."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import yaml

from queueapp.upstream.client import LlamaSwapClient
from queueapp.upstream.simulator.config import config_parallel, parse_config
from tests.upstream.helpers import chat

CONFIG = """
macros:
  llama: llama-server --port ${PORT}
models:
  chat:
    cmd: ${llama} -np 3 -m chat.gguf
  embed:
    cmd: ${llama} --embeddings
    env: [LLAMA_ARG_N_PARALLEL=2]
  plain:
    cmd: ${llama} -m plain.gguf
"""


def test_the_config_sets_each_models_slots_as_its_cmd_or_env_does():
    config = parse_config(yaml.safe_load(CONFIG))
    assert config.models["chat"].slots == 3 and config.models["plain"].slots is None
    assert config_parallel(config) == {"chat": 3, "embed": 2}


def test_props_reports_the_slots_and_three_requests_run_at_once(make_sim):
    sim = make_sim(
        config=parse_config(yaml.safe_load(CONFIG)),
        models={"chat": 0.5, "embed": 0.05, "plain": 0.05},
        swap_seconds=0.01,
        parallel_models={"plain": 2},  # the command line wins over the config
    )
    client = LlamaSwapClient(sim.url, job_timeout=10)
    try:
        assert client.server_slots("chat") == 3
        assert client.server_slots("plain") == 2
        assert client.server_slots("nobody") is None  # llama-swap's 404
    finally:
        client.close()
    props = httpx.get(f"{sim.url}/upstream/chat/props", timeout=10)
    assert props.status_code == 200 and props.headers["content-type"] == "application/json"

    with ThreadPoolExecutor(6) as pool:
        answers = list(
            pool.map(
                lambda n: httpx.post(
                    f"{sim.url}/v1/chat/completions", json=chat("chat", user=f"u{n}"), timeout=30
                ),
                range(6),
            )
        )
    assert [answer.status_code for answer in answers] == [200] * 6
    runs = [entry for entry in sim.log() if entry.get("body") and entry["status"] == 200]
    assert max(entry["in_flight"] for entry in runs) == 3
