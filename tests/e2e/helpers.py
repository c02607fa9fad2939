"""What several end-to-end modules share: the stack in front of the
simulator, waiting for dispatches, the front door's client, the live view's
viewer and the page checks.

Test modules import these from here, never from one another
(tests/test_layers.py checks): a test module then runs on its own, and
what two of them share is found in one place. The fixtures stay in
conftest.py, where pytest finds them; headless Chromium is in browser.py.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
import redis
from django.core.management import call_command
from openai import OpenAI
from websockets.sync.client import connect

from gpusched.stack import Stack, wait_for
from queueapp.models import DispatchDecision, Job, JobStatus, Tier
from queueapp.upstream.simulator import LlamaSwapSimulator
from tests import factories
from tests.database import database_url

# The stack in front of the simulator.


def e2e_simulator() -> LlamaSwapSimulator:
    """A started simulator as the end-to-end tests' GPUs are: chat-a and
    chat-b listed, any other model answered, 50 ms a job, 0.1 s a swap."""
    return LlamaSwapSimulator(
        models={"chat-a": 0.05, "chat-b": 0.05},
        default_seconds=0.05,
        accept_any_model=True,
        swap_seconds=0.1,
    ).start()


class World(Stack):
    """The stack on the test database, in front of the in-process simulator
    (whose log the tests read); every process it started is stopped at teardown."""

    def __init__(self, simulator: LlamaSwapSimulator, log_dir: Path) -> None:
        super().__init__(
            database_url=database_url(),
            log_dir=log_dir,
            upstream_url=simulator.url,
            media_root=log_dir / "media",
            access_log=True,
        )
        self.simulator = simulator

    def served(self) -> list[dict]:
        """The simulator's successful requests in arrival order."""
        return [entry for entry in self.simulator.log() if entry["status"] == 200]

    def served_labels(self) -> list[str]:
        return [entry["body"]["user"] for entry in self.served()]

    @property
    def sims(self) -> list[LlamaSwapSimulator]:
        """Its one GPU's simulator, as a `Scenario` lists its GPUs'."""
        return [self.simulator]

    def reset_log(self) -> None:
        self.simulator.reset_log()


class Scenario:
    """The system of a DESIGN.md scenario: one GPU (the world's simulator),
    or two that both serve every model. On one GPU the dispatch order is the
    simulator's own log; on two, where jobs run side by side, it is the
    order of the dispatch decisions, checked against the simulators' logs."""

    def __init__(self, world, second: LlamaSwapSimulator | None) -> None:
        self.world = world
        self.sims = [world.simulator] + ([second] if second else [])
        self.simulator = world.simulator  # the one GPU's, or gpu0's
        self.decided_after = 0

    @property
    def servers(self) -> list:
        """The web servers started in front of it."""
        return self.world.servers

    @property
    def upstreams(self) -> str:
        return ",".join(f"gpu{i}={sim.url}" for i, sim in enumerate(self.sims))

    def start_cluster(self) -> None:
        if len(self.sims) == 1:
            self.world.start_cluster()
            return
        for index in range(len(self.sims)):
            self.world.start_cluster(upstream_url=self.upstreams, GPUSCHED_GPU=f"gpu{index}")

    def log(self) -> list[dict]:
        return [entry for sim in self.sims for entry in sim.log()]

    def served(self) -> list[dict]:
        """Every simulator's successful requests, in arrival order."""
        entries = [e for sim in self.sims for e in sim.log() if e["status"] == 200]
        return sorted(entries, key=lambda e: e["received_at"])

    def served_labels(self) -> list[str]:
        """The jobs in the order they were dispatched."""
        if len(self.sims) == 1:
            return self.world.served_labels()
        # The logs first: a job served was decided before it was sent, while
        # jobs that go on being dispatched add decisions after this read.
        served = [e["body"]["user"] for e in self.served()]
        labels = [
            decision.job.body["user"]
            for decision in DispatchDecision.objects.filter(pk__gt=self.decided_after)
            .select_related("job")
            .order_by("id")
        ]
        # Each job answered once, and only jobs that were dispatched (some may run still).
        assert len(served) == len(set(served)) and set(served) <= set(labels), (served, labels)
        return labels

    def reset_log(self) -> None:
        for sim in self.sims:
            sim.reset_log()
        self.decided_after = (
            DispatchDecision.objects.order_by("-id").values_list("id", flat=True).first() or 0
        )


# One running system that a module's cases share, each with rows of its own.
#
# Starting a cluster and a web server costs about 4 s of CPU; a module whose
# cases only submit and read starts them once. Its cases must all use it: a
# case that started a cluster of its own beside it would have its jobs taken
# by the shared one (one GPU name, one database).


@contextmanager
def shared_system(
    tmp_path_factory, django_db_blocker, *, gpus: int = 1, web: bool = False
) -> Iterator[Scenario]:
    """Simulators (e2e_simulator's), a dispatcher cluster each, and a web
    server if asked for, up until the module's last case."""
    simulators = [e2e_simulator() for _ in range(gpus)]
    try:
        with World(simulators[0], tmp_path_factory.mktemp("shared")) as world:
            system = Scenario(world, simulators[1] if gpus == 2 else None)
            system.start_cluster()
            if web:
                world.start_web()
            yield system
    finally:
        for simulator in simulators:
            simulator.stop()
        with django_db_blocker.unblock():
            # What it wrote after its last case's tables were emptied (its
            # GPUs registered again, say): the next module starts empty.
            call_command("flush", interactive=False, verbosity=0, reset_sequences=False)


@contextmanager
def case_on(system) -> Iterator:
    """One case on a shared system: the tiers and policy as the fixtures
    define them (on two GPUs every tier's running limit strict, as the
    `scenario` fixture has it), the logs emptied; after it, every job ended
    before `transactional_db` empties the tables. The system's dispatchers
    write meanwhile, and PostgreSQL may abort that flush to break a
    deadlock: tests/conftest.py runs it again."""
    factories.policy()
    factories.tiers()
    if len(system.sims) == 2:
        Tier.objects.update(strict_running_limit=True)
    system.reset_log()
    yield system
    wait_for(
        lambda: not Job.objects.filter(status__in=[JobStatus.QUEUED, JobStatus.RUNNING]).exists(),
        message="the case's jobs to end before its rows go",
    )


# Dispatches, waited for.


@contextmanager
def world_in_front_of(simulator: LlamaSwapSimulator, log_dir: Path) -> Iterator[World]:
    """Tiers and policy as the fixtures define them, and the stack in front of
    `simulator` (started), which is stopped with it."""
    factories.schedules()  # the clusters' safety nets, as an install has them
    factories.policy()
    factories.tiers()
    try:
        with World(simulator, log_dir) as world:
            yield world
    finally:
        simulator.stop()


def release_and_wait(scenario, expected_count):
    factories.policy(dispatch_paused=False)
    wait_for(
        lambda: (
            len(scenario.served()) >= expected_count
            and not Job.objects.filter(status__in=[JobStatus.QUEUED, JobStatus.RUNNING]).exists()
        ),
        message=f"{expected_count} jobs served",
    )
    return scenario.served_labels()


def make_resident(scenario, owner, model):
    """Have every GPU's llama-swap load `model` (on one GPU: by running a job of it)."""
    if len(scenario.sims) == 1:
        factories.job(owner, model=model, label=f"warm-{model}")
    else:
        for sim in scenario.sims:  # as another client of llama-swap would
            httpx.post(f"{sim.url}/v1/chat/completions", json=factories.chat_body(model))
    for sim in scenario.sims:
        wait_for(
            lambda sim=sim: (
                sim.running()["running"]
                and sim.running()["running"][0]["state"] == "ready"
                and sim.running()["running"][0]["model"] == model
                and not Job.objects.exclude(status=JobStatus.SUCCEEDED).exists()
            ),
            message=f"{model} resident",
        )
    scenario.reset_log()


def all_ended(jobs: list[Job]) -> bool:
    ids = [job.pk for job in jobs]
    return not Job.objects.filter(pk__in=ids, status__in=["queued", "running"]).exists()


# The front door, as the openai package calls it.


def ended(job_id: int) -> Job:
    """The job once its end is written: the caller gets its answer first,
    and the web process writes the end while the answer goes out."""
    return wait_for(
        lambda: (
            Job.objects.filter(pk=job_id)
            .exclude(status__in=(JobStatus.QUEUED, JobStatus.RUNNING))
            .first()
        ),
        message=f"job {job_id} to end",
    )


def client_for(web, token, **kwargs):
    return OpenAI(base_url=f"{web.url}/v1", api_key=token, timeout=60, max_retries=0, **kwargs)


def front_door_call_in_thread(
    web, token: str, seconds: float, answers: list, failures: list, **create
) -> threading.Thread:
    """A chat-a call through `web`'s front door that runs `seconds` on the
    simulated GPU, in a thread of its own (started): its answer goes to
    `answers`, an exception to `failures`; `create` adds to the call."""

    def call() -> None:
        try:
            answers.append(
                client_for(web, token).chat.completions.create(
                    model="chat-a",
                    messages=[{"role": "user", "content": "hi"}],
                    extra_body={"sim": {"seconds": seconds}},
                    **create,
                )
            )
        except Exception as exc:  # noqa: BLE001  # the test asserts on it
            failures.append(exc)

    thread = threading.Thread(target=call)
    thread.start()
    return thread


def streamed_text(events: bytes) -> str:
    """The text of a chat stream, as a client joins its deltas."""
    text = []
    for line in events.decode().splitlines():
        if line.startswith("data: {"):
            for choice in json.loads(line.removeprefix("data: "))["choices"]:
                text.append(choice["delta"].get("content") or "")
    return "".join(text)


class HangingUpCaller:
    """A front-door call on a plain socket, so that the test chooses the
    moment its caller hangs up (`hang_up`), not a client's timeout."""

    def __init__(self, web, token: str, path: str, body: dict) -> None:
        address = urlsplit(web.url)
        payload = json.dumps(body).encode()
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {address.hostname}\r\n"
            f"Authorization: Bearer {token}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n"
        )
        self.socket = socket.create_connection((address.hostname, address.port), timeout=30)
        self.socket.sendall(head.encode() + payload)

    def hang_up(self) -> None:
        self.socket.close()


def requests_in_flight_together(log: list[dict]) -> int:
    """How many of a simulated GPU's requests reached it while another was
    still in flight there (from its arrival to its end, refused requests
    included): 0 when the GPU never had two at once."""
    entries = sorted(log, key=lambda entry: entry["received_at"])
    return sum(
        any(
            earlier["finished_at"] is None or earlier["finished_at"] > entry["received_at"]
            for earlier in entries[:index]
        )
        for index, entry in enumerate(entries)
    )


# The live view: its WebSocket, on PostgreSQL NOTIFY or on Redis.

REDIS_URL = os.environ.get("GPUSCHED_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")


def redis_available() -> bool:
    try:
        return bool(redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1).ping())
    except redis.RedisError:
        return False


class Watcher:
    """A WebSocket viewer that records when it saw each state of a job."""

    def __init__(self, base_url: str, token: str) -> None:
        host = base_url.removeprefix("http://")
        self._connection = connect(f"ws://{host}/ws/queue/", origin=base_url, open_timeout=10)
        self.token = token

    def __enter__(self) -> Watcher:
        self.socket = self._connection.__enter__()
        assert json.loads(self.socket.recv(timeout=10))["type"] == "auth_required"
        self.socket.send(json.dumps({"type": "auth", "token": self.token}))
        self.state = json.loads(self.socket.recv(timeout=10))
        assert self.state["type"] == "snapshot"
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._connection.__exit__(*exc_info)

    def state_of(self, job_id: int) -> str:
        if any(entry["id"] == job_id for entry in self.state.get("running_all") or []):
            return "running"
        if self.state["running"] and self.state["running"]["id"] == job_id:
            return "running"
        if any(entry["id"] == job_id for entry in self.state["queued"]):
            return "queued"
        return "gone"

    def wait_for_state(self, job_id: int, wanted: str, timeout: float = 15) -> float:
        """Returns the wall-clock time the update showing `wanted` arrived."""
        deadline = time.monotonic() + timeout
        while self.state_of(job_id) != wanted:
            left = deadline - time.monotonic()
            if left <= 0:
                pytest.fail(f"job {job_id} never showed as {wanted} on the live view")
            self.receive(timeout=left)
        return time.time()

    def receive(self, timeout: float) -> None:
        """The next message: a full state, or a delta applied to the one held."""
        message = json.loads(self.socket.recv(timeout=timeout))
        if message["type"] == "delta":
            assert message["base"] == self.state["version"], "a version was skipped"
            self.state = {**self.state, **message["changes"], "version": message["version"]}
        else:
            self.state = message


# Pages: what fits a phone and stays inside its card.

PHONE = {"width": 390, "height": 844}


def cards_that_scroll(page) -> list[str]:
    """Cards whose content is wider than they are."""
    return page.eval_on_selector_all(
        ".card",
        "cards => cards.filter(c => c.scrollWidth > c.clientWidth)"
        ".map(c => (c.id || c.querySelector('h2')?.textContent) + ': ' + c.scrollWidth)",
    )


def outside_card(page, card: str) -> list[str]:
    """What passes the right edge of `card`, and the card itself when its
    content is wider than it (it would scroll)."""
    return page.eval_on_selector(
        card,
        """card => {
            const edge = card.getBoundingClientRect().right;
            const out = [...card.querySelectorAll('*')]
                .filter(e => e.getBoundingClientRect().width > 0
                             && e.getBoundingClientRect().right > edge + 0.5)
                .map(e => e.tagName + '.' + e.className + ': ' + e.textContent.slice(0, 40));
            if (card.scrollWidth > card.clientWidth) out.push('scrolls: ' + card.scrollWidth);
            return out;
        }""",
    )


def submit_trace(trace, members: dict) -> None:
    """Every job of a policy-simulator trace, submitted as a chat job: its
    id travels as the body's `user`, its run time as the simulator's
    `sim.seconds`."""
    from queueapp import services

    for job in trace.jobs:
        services.job_submit(
            member=members[job.member],
            path="/v1/chat/completions",
            body={
                "model": job.model,
                "messages": [{"role": "user", "content": "hi"}],
                "user": job.id,
                "sim": {"seconds": job.seconds},
            },
            model=job.model,
            priority_header=job.priority,
        )


# The front door's answers, as the simulator sent them.


def simulator_answer(simulator, path):
    """What the simulator itself sent for the latest request it logged on `path`."""
    *_, entry = [entry for entry in simulator.log() if entry["path"] == path]
    return simulator.sent(entry["seq"])


def assert_relayed_unchanged(answer, sent):
    """`answer` (httpx's or the openai package's raw response) is what was
    `sent`, after any waiting comments of gpusched's own: a stream's grant
    slower than the quiet time (a loaded machine) sends one first."""
    body = answer.content
    if answer.headers["content-type"].startswith("text/event-stream"):
        while body.startswith(b": "):
            comment, separator, body = body.partition(b"\n\n")
            assert separator and b"\n" not in comment, answer.content
    relayed = (answer.status_code, answer.headers["content-type"], body)
    assert relayed == (sent["status"], sent["content_type"], sent["body"])


def assert_job_headers(headers, job, *, head_before_dispatch: bool = False):
    """The job headers of an answer about `job`. `head_before_dispatch`: a
    waiting stream's head, sent with its first comment, before any score."""
    assert headers["x-gpusched-job-id"] == str(job.pk)
    assert headers["x-gpusched-priority-requested"] == str(job.priority_requested)
    assert headers["x-gpusched-priority-applied"] == str(job.priority)
    assert headers["x-gpusched-why"] == f"/jobs/{job.pk}/why/"
    score = (job.score_at_dispatch or {}).get("effective")
    if score is None or head_before_dispatch:
        assert headers["x-gpusched-score"] == ""  # not ranked when the head left
    else:
        assert float(headers["x-gpusched-score"]) == pytest.approx(score, rel=1e-5)
