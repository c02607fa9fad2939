"""llama-swap protected by `apiKeys`, as real processes: the simulator wants a
key, gpusched's dispatcher cluster and web server (Daphne) send theirs from
LLAMA_SWAP_API_KEY. With the right key a REST job, front-door calls and a
preload run, and llama-swap sees the key and none of a caller's credentials.
Without it, or with a wrong one, health says which GPU refused it, jobs
wait in the queue unfailed, the dispatcher backs off, and a front-door call
is answered 503 naming gpusched's configuration. The key is in no log line
and no answer."""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator

import httpx
import pytest

from gpusched.stack import wait_for
from queueapp import services
from queueapp.models import Job, JobEvent, JobStatus
from queueapp.upstream.client import KEY_REFUSED
from queueapp.upstream.simulator import LlamaSwapSimulator
from tests import factories
from tests.e2e.helpers import World, ended, world_in_front_of

pytestmark = [pytest.mark.e2e]

KEY = "sk-llama-swap-Key-4711"
CHAT = factories.chat_body("chat-a")


@pytest.fixture
def keyed(transactional_db, tmp_path) -> Iterator[World]:
    """The stack in front of a simulator whose llama-swap config has `apiKeys: [KEY]`."""
    simulator = LlamaSwapSimulator(
        models={"chat-a": 0.05, "chat-b": 0.05}, swap_seconds=0.1, api_keys=[KEY]
    ).start()
    with world_in_front_of(simulator, tmp_path) as world:
        yield world


def caller_credentials(token: str) -> dict[str, str]:
    """A caller's request with every credential header a client may send."""
    proxy = base64.b64encode(f"me:{token}".encode()).decode()
    return {
        "Authorization": f"Bearer {token}",
        "x-api-key": token,
        "Cookie": f"sessionid={token}; csrftoken={token}",
        "Proxy-Authorization": f"Basic {proxy}",
    }


def everything_written(world: World) -> str:
    """Every log line of every process the stack started."""
    return "\n".join(process.log_text() for process in world.processes())


def test_with_the_key_jobs_calls_and_preloads_run_and_llama_swap_sees_only_the_key(keyed):
    keyed.start_cluster(LLAMA_SWAP_API_KEY=KEY)
    web = keyed.start_web(LLAMA_SWAP_API_KEY=KEY)
    _, token = factories.member("ann", "pro")
    headers = caller_credentials(token)
    answers: list[httpx.Response] = []

    rest = httpx.post(
        f"{web.url}/api/jobs/",
        json={"path": "/v1/chat/completions", "body": CHAT},
        headers=headers,
        timeout=30,
    )
    assert rest.status_code == 201, rest.text
    assert ended(rest.json()["id"]).status == JobStatus.SUCCEEDED
    call = httpx.post(f"{web.url}/v1/chat/completions", json=CHAT, headers=headers, timeout=60)
    assert call.status_code == 200, call.text
    assert call.json()["object"] == "chat.completion"
    models = httpx.get(f"{web.url}/v1/models", headers=headers, timeout=30)
    assert models.status_code == 200 and {m["id"] for m in models.json()["data"]} == {
        "chat-a",
        "chat-b",
    }
    member = Job.objects.get(pk=rest.json()["id"]).member
    preload = services.job_preload(member=member, model="chat-b", priority_header=None)
    assert ended(preload.pk).status == JobStatus.SUCCEEDED
    answers += [rest, call, models]
    for path in ["/api/health/", "/api/gpus/", f"/api/jobs/{preload.pk}/", "/api/queue/"]:
        answers.append(httpx.get(f"{web.url}{path}", headers=headers, timeout=30))

    assert [(e["path"], e["status"]) for e in keyed.simulator.log()] == [
        ("/v1/chat/completions", 200),
        ("/v1/chat/completions", 200),
        ("/upstream/chat-b/", 200),
    ]
    seen = keyed.simulator.api_keys.seen()
    paths = {entry["path"] for entry in seen}
    assert {"/running", "/v1/models", "/v1/chat/completions", "/upstream/chat-b/"} <= paths
    # Every call carried gpusched's key as Bearer, and no other credential:
    # neither the member's token nor its cookie or proxy credentials.
    assert {(e["key_from"], e["key_matched"], tuple(e["credential_headers"])) for e in seen} == {
        ("bearer", True, ("authorization",))
    }
    assert all(answer.status_code < 400 for answer in answers)
    assert not any(KEY in answer.text for answer in answers)
    assert KEY not in everything_written(keyed)


def degraded_naming_the_key(web) -> dict | None:
    health = httpx.get(f"{web.url}/api/health/", timeout=30).json()
    refused = [p for p in health.get("problems", []) if p.startswith(f"GPU gpu0: {KEY_REFUSED}")]
    return health if health["status"] == "degraded" and refused else None


def probes_since(world: World, since: float, *, at_least: int) -> list[dict]:
    """The `GET /running` calls llama-swap had since `since`, once there are `at_least`."""
    probes = [
        e
        for e in world.simulator.api_keys.seen()
        if e["path"] == "/running" and e["received_at"] >= since
    ]
    return probes if len(probes) >= at_least else []


@pytest.mark.parametrize("sent", ["", "sk-wrong-Key-0815"])
def test_without_the_right_key_health_names_the_gpu_and_jobs_wait_unfailed(keyed, sent):
    keyed.start_cluster(LLAMA_SWAP_API_KEY=sent)
    web = keyed.start_web(LLAMA_SWAP_API_KEY=sent)
    _, token = factories.member("ann", "pro")
    submitted_at = time.time()
    submitted = httpx.post(
        f"{web.url}/api/jobs/",
        json={"path": "/v1/chat/completions", "body": CHAT},
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )
    assert submitted.status_code == 201, submitted.text

    health = wait_for(lambda: degraded_naming_the_key(web), message="health naming the key")
    (gpu,) = health["gpus"]
    assert (gpu["name"], gpu["healthy"]) == ("gpu0", False)
    assert gpu["error"].startswith(KEY_REFUSED)
    fix = "is not one of llama-swap's apiKeys" if sent else "gpusched sends no key"
    assert fix in gpu["error"]
    # With a job waiting, the dispatcher asks again after a growing pause
    # (0.5 s, doubling), and its watch re-reads /running after a growing
    # pause too (queueapp/dispatch/upstream_watch.py): six probes take
    # seconds, where a loop would make them in milliseconds.
    probes = wait_for(
        lambda: probes_since(keyed, submitted_at, at_least=6),
        timeout=30,
        message="six refused probes",
    )
    assert probes[5]["received_at"] - probes[0]["received_at"] >= 3.0, probes
    assert {e["key_matched"] for e in probes} == {False}
    job = Job.objects.get(pk=submitted.json()["id"])
    assert (job.status, job.attempts, job.error) == (JobStatus.QUEUED, 0, "")
    assert keyed.simulator.log() == []  # no body reached the GPU
    read = httpx.get(
        f"{web.url}/api/jobs/{job.pk}/", headers={"Authorization": f"Bearer {token}"}, timeout=30
    )
    assert read.json()["status"] == "queued"
    if sent:
        assert sent not in read.text + str(health) + everything_written(keyed)


def test_a_front_door_call_refused_the_key_is_a_503_that_blames_gpuscheds_configuration(keyed):
    """The dispatcher has the key (the GPU is healthy and granted), the web
    server a wrong one: the call's own request to llama-swap is refused."""
    wrong = "sk-wrong-Key-0815"
    keyed.start_cluster(LLAMA_SWAP_API_KEY=KEY)
    web = keyed.start_web(LLAMA_SWAP_API_KEY=wrong)
    _, token = factories.member("ann", "pro")
    wait_for(
        lambda: httpx.get(f"{web.url}/api/health/", timeout=30).json()["gpus"][0]["healthy"],
        message="gpu0 healthy",
    )

    answer = httpx.post(
        f"{web.url}/v1/chat/completions",
        json=CHAT,
        headers=caller_credentials(token),
        timeout=60,
    )

    assert answer.status_code == 503, answer.text
    assert answer.headers["retry-after"]
    error = answer.json()["error"]
    assert (error["type"], error["code"]) == ("server_error", "upstream_key_refused")
    assert KEY_REFUSED in error["message"] and "not your key" in error["message"]
    assert "GPU gpu0" in error["message"]
    job = ended(int(answer.headers["x-gpusched-job-id"]))
    assert (job.status, job.attempts) == (JobStatus.CANCELLED, 0)
    assert JobEvent.objects.filter(job=job, kind=JobEvent.Kind.RETURNED_TO_QUEUE).exists()
    assert keyed.simulator.log() == []
    refused = [e for e in keyed.simulator.api_keys.seen() if e["path"] == "/v1/chat/completions"]
    assert [(e["key_matched"], e["credential_headers"]) for e in refused] == [
        (False, ["authorization"])
    ]
    models = httpx.get(f"{web.url}/v1/models", headers=caller_credentials(token), timeout=30)
    assert models.status_code == 503 and models.json()["error"]["code"] == "upstream_key_refused"
    assert not any(k in answer.text + models.text for k in (KEY, wrong))
    assert wrong not in everything_written(keyed) and KEY not in everything_written(keyed)
