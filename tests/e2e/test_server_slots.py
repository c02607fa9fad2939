"""A model's slots as its server has them, with real processes: a dispatcher
cluster reading a llama-swap config (LLAMA_SWAP_CONFIG) whose chat model's
`cmd` says `-np 3`, in front of the simulator serving that config.

Before any load, `GET /api/models/` shows the config's 3; once the chat
server runs and reports its slots (`/upstream/chat/props`), the server's;
six chats run three at a time at llama-swap. A model whose `cmd` sets no
slots shows 1 until its server says otherwise, whether its jobs come over
REST or through the front door."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import yaml

from gpusched.stack import Stack, wait_for
from queueapp import services
from queueapp.models import Gpu, Job, JobStatus
from queueapp.upstream.simulator import LlamaSwapSimulator
from queueapp.upstream.simulator.config import parse_config
from tests import factories
from tests.database import database_url
from tests.e2e.helpers import all_ended, client_for

pytestmark = [pytest.mark.e2e]

CONFIG = """
macros:
  llama: llama-server --port ${PORT}
models:
  chat:
    cmd: ${llama} -np 3 -m /models/chat.gguf
  plain:
    cmd: ${llama} -m /models/plain.gguf
"""


class SlotsStack:
    def __init__(self, stack: Stack, simulator: LlamaSwapSimulator) -> None:
        self.stack = stack
        self.simulator = simulator


@pytest.fixture
def slots_stack(transactional_db, tmp_path) -> Iterator[SlotsStack]:
    path = tmp_path / "llama-swap.yaml"
    path.write_text(CONFIG, encoding="utf-8")
    simulator = LlamaSwapSimulator(
        config=parse_config(yaml.safe_load(CONFIG)),
        models={"chat": 1.0, "plain": 0.05},
        swap_seconds=0.1,
        # The plain model's server answers two at once, though its cmd says nothing.
        parallel_models={"plain": 2},
    ).start()
    factories.policy()
    factories.tiers()
    try:
        with Stack(database_url=database_url(), log_dir=tmp_path, upstream_url=simulator.url) as s:
            s.start_cluster(LLAMA_SWAP_CONFIG=str(path))
            yield SlotsStack(s, simulator)
    finally:
        simulator.stop()


def parallel_of(api, token: str) -> dict[str, tuple[int, str]]:
    listed = api.as_member(token).get("/api/models/")
    assert listed.status_code == 200
    return {model["name"]: (model["parallel"], model["parallel_source"]) for model in listed.json()}


def test_slots_come_from_the_config_then_the_server_and_six_chats_run_three_at_once(
    slots_stack, api
):
    members = [factories.member(f"m{i}", "pro") for i in range(3)]
    token = members[0][1]
    wait_for(
        lambda: Gpu.objects.filter(routing__isnull=False).exists(),
        message="the dispatcher to read llama-swap's config",
    )
    # Before any load: what the config's cmd says (plain is listed once its
    # dispatcher has read llama-swap's list of models).
    wait_for(
        lambda: parallel_of(api, token) == {"chat": (3, "config"), "plain": (1, "default")},
        message="both models listed with the config's slots",
    )

    services.policy_update(changes={"dispatch_paused": True})
    chats = [
        factories.job(members[i % 3][0], model="chat", seconds=1.0, label=f"chat-{i}")
        for i in range(6)
    ]
    services.policy_update(changes={"dispatch_paused": False})
    wait_for(lambda: all_ended(chats), timeout=60, message="the six chats to end")

    assert Job.objects.filter(pk__in=[j.pk for j in chats], status=JobStatus.SUCCEEDED).count() == 6
    answered = [entry for entry in slots_stack.simulator.log() if entry["status"] == 200]
    chat_runs = [entry for entry in answered if entry["model"] == "chat" and entry.get("body")]
    assert len(chat_runs) == 6
    # Three at a time at llama-swap: never more, and the slots were used.
    assert max(entry["in_flight"] for entry in chat_runs) == 3
    # The server, once ready, was asked for its slots, and says 3 too.
    wait_for(
        lambda: parallel_of(api, token)["chat"] == (3, "server"),
        message="the chat server's slots to be recorded",
    )

    # A model whose cmd sets nothing: 1 until its server says 2.
    plain = factories.job(members[0][0], model="plain", seconds=0.05, label="plain")
    wait_for(lambda: all_ended([plain]), timeout=30, message="the plain job to end")
    wait_for(
        lambda: parallel_of(api, token)["plain"] == (2, "server"),
        message="the plain server's slots to be recorded",
    )


def test_a_gpu_serving_only_front_door_calls_learns_its_servers_slots_too(slots_stack, api):
    """No REST job runs here: the web process asks the server, after the
    call's answer and before its job's end."""
    _, token = factories.member("ann", "pro")
    web = slots_stack.stack.start_web()
    wait_for(
        lambda: parallel_of(api, token).get("plain") == (1, "default"),
        message="plain listed, its cmd setting no slots",
    )
    answer = client_for(web, token).chat.completions.create(
        model="plain", messages=[{"role": "user", "content": "hello"}]
    )
    assert answer.model == "plain"
    wait_for(
        lambda: parallel_of(api, token)["plain"] == (2, "server"),
        message="the plain server's slots recorded by the front door",
    )
    (job,) = Job.objects.filter(model="plain")
    assert job.front_door and job.status == JobStatus.SUCCEEDED
