"""What `make smoke-deploy` asks of the installed gpusched, through nginx
over HTTPS: the redirect, a REST job, front-door calls plain and streaming,
the dashboard's WebSocket (deploy/smoke_deploy.py)."""

from __future__ import annotations

import json
import ssl
import time
from collections.abc import Callable

import httpx
from websockets.sync.client import connect

from deploy.smoke_layout import Layout
from gpusched.stack import wait_for

JOB_SECONDS = 60
CHAT = {"model": "chat-small", "messages": [{"role": "user", "content": "hello"}]}
# The simulator spreads a 1 s answer's events over that second: through a
# proxy that buffers they would arrive together.
STREAM_SPREAD_SECONDS = 0.3


def _client(layout: Layout) -> httpx.Client:
    return httpx.Client(
        base_url=f"https://localhost:{layout.https_port}",
        verify=str(layout.cert),
        headers={"Authorization": f"Bearer {layout.token}"},
        timeout=JOB_SECONDS,
    )


def redirect_to_https(layout: Layout) -> None:
    answer = httpx.get(f"http://localhost:{layout.http_port}/api/queue/", timeout=10)
    location = answer.headers.get("location", "")
    if answer.status_code != 301 or not location.startswith("https://localhost/api/queue/"):
        raise RuntimeError(f"plain HTTP answered {answer.status_code} {location!r}")


def rest_job_succeeds(layout: Layout) -> None:
    with _client(layout) as client:
        created = client.post("/api/jobs/", json={"path": "/v1/chat/completions", "body": CHAT})
        if created.status_code != 201:
            raise RuntimeError(f"POST /api/jobs/ answered {created.status_code}: {created.text}")
        job_id = created.json()["id"]

        def finished() -> str | None:
            status = client.get(f"/api/jobs/{job_id}/").json()["status"]
            return status if status not in ("queued", "running") else None

        status = wait_for(finished, timeout=JOB_SECONDS, message=f"job {job_id} to end")
        if status != "succeeded":
            raise RuntimeError(f"job {job_id} ended {status}")


def front_door_chat(layout: Layout) -> None:
    with _client(layout) as client:
        answer = client.post("/v1/chat/completions", json=CHAT)
        if answer.status_code != 200 or not answer.json().get("choices"):
            raise RuntimeError(f"the front door answered {answer.status_code}: {answer.text}")


def front_door_stream(layout: Layout) -> None:
    """Server-sent events, each as it is written: the first well before the last."""
    arrivals: list[float] = []
    with _client(layout) as client:
        with client.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as answer:
            kind = answer.headers.get("content-type", "")
            if answer.status_code != 200 or "text/event-stream" not in kind:
                raise RuntimeError(f"a streaming call answered {answer.status_code} {kind}")
            events = []
            for line in answer.iter_lines():
                if line.startswith("data: "):
                    events.append(line.removeprefix("data: "))
                    arrivals.append(time.monotonic())
    if len(events) < 3 or events[-1] != "[DONE]":
        raise RuntimeError(f"the stream held {events!r}")
    json.loads(events[0])  # an event is a JSON chunk
    if arrivals[-1] - arrivals[0] < STREAM_SPREAD_SECONDS:
        raise RuntimeError("the events arrived together: something buffers the stream")


def dashboard_websocket(layout: Layout) -> None:
    """The live queue over wss:// (an origin the site allows, then the token)."""
    context = ssl.create_default_context(cafile=str(layout.cert))
    site = f"localhost:{layout.https_port}"
    with connect(
        f"wss://{site}/ws/queue/", origin=f"https://{site}", ssl=context, open_timeout=10
    ) as socket:
        first = json.loads(socket.recv(timeout=10))
        if first.get("type") != "auth_required":
            raise RuntimeError(f"the WebSocket said first {first!r}")
        socket.send(json.dumps({"type": "auth", "token": layout.token}))
        snapshot = json.loads(socket.recv(timeout=10))
        if snapshot.get("type") != "snapshot":
            raise RuntimeError(f"after the token the WebSocket said {snapshot!r}")


def through_nginx(layout: Layout) -> list[tuple[str, Callable[[], None]]]:
    return [
        ("plain HTTP is redirected to HTTPS", lambda: redirect_to_https(layout)),
        ("a REST job succeeds", lambda: rest_job_succeeds(layout)),
        ("a front-door chat", lambda: front_door_chat(layout)),
        ("a streaming front-door chat arrives as SSE chunks", lambda: front_door_stream(layout)),
        ("the dashboard's WebSocket sends its first messages", lambda: dashboard_websocket(layout)),
    ]
