"""gpusched's side of llama-swap: the same HTTP calls any llama-swap client makes.

`GET /running` failing before a claim means nothing is claimed: jobs stay
queued while the pass backs off. After a claim, what an answer means for the
job turns on one question, was the body taken?
- connection refused (`UpstreamUnreachable`): never sent, so the job goes
  back to the queue with its attempts unchanged;
- 429 (`UpstreamAnswer.is_busy`): llama-swap's own concurrency limit, hit
  by another client; refused, not run, so back to the queue, and the pass
  waits for its Retry-After;
- a timeout or a broken connection after the body was sent
  (`UpstreamBroken`): the job fails, since it may have run;
- any other answer is stored: 2xx succeeds, unless it says JSON and does not
  parse (a broken backend is not a result); 4xx and 5xx fail the job with
  llama-swap's message. Large and binary answers go to file storage, not
  the jobs table.

A preload asks llama-swap to load a model without a request, its own way:
`GET /upstream/<model>/` swaps the model in and proxies `GET /` to its
server (llama-swap's UI "Load" button and its `hooks.on_startup.preload` do
just that; it has no load endpoint of its own). What the model's server
answers at `/` (llama-server's web page, vLLM's 404) is not the result: the
model is loaded once llama-swap got an answer from it, or `GET /running`
says it is ready; a short JSON record is stored instead. A preload job's
`path` is that load path (the model's name unencoded), not a column of its
own: whatever reads a job's path (the dispatcher, the estimates, the run
statistics) tells it apart with `is_preload`.

A llama-swap with `apiKeys` answers every route but `/health` (and its UI's
page and icon) with 401 and `WWW-Authenticate: Basic realm="llama-swap"`
until it gets one of its keys. gpusched sends its key (`LLAMA_SWAP_API_KEY`)
as `Authorization: Bearer` on every call to that GPU; the headers are built
in one place, `upstream_auth_headers`, and never from a caller's request.
llama-swap's own 401 (its realm: a model server's 401 is an answer like any
other) is `UpstreamKeyRefused`, an `UpstreamUnreachable`: the body was not
taken, so the job goes back to the queue with its attempts unchanged, the
GPU's row records the refusal (health says `degraded`) and the dispatcher
backs off until the key is right. The key is in no message: the error names
the variable to fix.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx
from django.conf import settings

from gpusched.upstreams import API_KEY_FILE_VARIABLE, API_KEY_VARIABLE, bearer_headers
from queueapp.http_headers import retry_after_seconds
from queueapp.policy.server_slots import slots_from_props
from queueapp.upstream.llama_swap_state import (
    FORWARDED_JOB_HEADER,
    READY,
    event_payload,
    running_entries,
    server_sent_events,
)

# The POST paths llama-swap routes to a model, and that the API accepts as a
# job's `path`. Each JSON body names its model in the `model` field.
FORWARDED_PATHS: tuple[str, ...] = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
    "/v1/embeddings",
    "/v1/rerank",
    "/v1/images/generations",
    "/v1/images/edits",
    "/v1/audio/speech",
    "/sdapi/v1/txt2img",
    "/sdapi/v1/img2img",
)
# Relayed by the front door only: their bodies are multipart forms, not the
# JSON a REST job carries.
FRONT_DOOR_ONLY_PATHS: tuple[str, ...] = ("/v1/audio/transcriptions",)
FRONT_DOOR_PATHS: tuple[str, ...] = (*FORWARDED_PATHS, *FRONT_DOOR_ONLY_PATHS)


# A preload's job path: what the dispatcher GETs to load its model.
PRELOAD_PATH_PREFIX = "/upstream/"


def preload_path(model: str) -> str:
    """A preload job's path: llama-swap's `/upstream/<model>/`, the name as
    given. The request percent-encodes it (`preload_request_path`); the job
    keeps it readable and as long as the name allows (an encoded character
    takes up to 12), so the column's size follows the name's limit
    (job_body.MAX_JOB_PATH)."""
    return f"{PRELOAD_PATH_PREFIX}{model}/"


def preload_request_path(model: str) -> str:
    """The path the dispatcher GETs to load `model`."""
    return f"{PRELOAD_PATH_PREFIX}{quote(model, safe='/')}/"


def is_preload(path: str) -> bool:
    """Whether a job of `path` only loads its model (`preload_path`)."""
    return path.startswith(PRELOAD_PATH_PREFIX)


class UpstreamUnreachable(Exception):
    """llama-swap did not accept the connection: the body was never sent."""


class UpstreamCut(UpstreamUnreachable):
    """llama-swap unloaded the model under the request (its 502, or 500
    while the request waited for the load): nothing came back, and the job
    goes back to the queue once (queueapp/dispatch/forwarding.py)."""


# What llama-swap answers a request whose model it unloads mid-way
# (internal/router/base.go Unload): 502 from Go's reverse proxy while the
# model's server computed it, 500 "model unloaded" while it waited for the
# load. A crash of the model's server looks the same.
CUT_STATUSES = (500, 502)


class UpstreamKeyRefused(UpstreamUnreachable):
    """llama-swap refused gpusched's API key (its own 401): nothing ran. A
    configuration problem of gpusched's, never the caller's."""


# How llama-swap marks its own refusal of a key (internal/server/auth.go).
LLAMA_SWAP_REALM = 'realm="llama-swap"'
KEY_REFUSED = "llama-swap refused the API key"


def upstream_auth_headers(gpu_name: str) -> dict[str, str]:
    """The headers that carry gpusched's key to GPU `gpu_name`'s llama-swap
    (none without a key): every call gpusched makes there adds them, the
    dispatcher's, the front door's and the events stream's."""
    return bearer_headers(settings.LLAMA_SWAP_API_KEYS.key_for(gpu_name))


def key_refused(status_code: int, www_authenticate: str | None) -> bool:
    """Whether an answer is llama-swap's refusal of the key (401 in its
    realm), not a model server's 401 relayed."""
    return status_code == 401 and LLAMA_SWAP_REALM in (www_authenticate or "")


def key_refused_error(call: str, *, sent_key: bool) -> UpstreamKeyRefused:
    """The refusal of `call` (e.g. "GET /running"), saying what to fix."""
    fix = (
        f"the key gpusched sends ({API_KEY_VARIABLE} or {API_KEY_FILE_VARIABLE}) is not "
        "one of llama-swap's apiKeys"
        if sent_key
        else f"gpusched sends no key: set {API_KEY_VARIABLE} or {API_KEY_FILE_VARIABLE} to "
        "one of llama-swap's apiKeys"
    )
    return UpstreamKeyRefused(f"{KEY_REFUSED} (401 to {call}): {fix}")


class UpstreamBroken(Exception):
    """The call started but no complete answer came back (timeout, reset)."""


@dataclass(frozen=True)
class UpstreamAnswer:
    status_code: int
    content_type: str
    content: bytes
    retry_after: float | None

    @property
    def is_busy(self) -> bool:
        """llama-swap refused because another client holds its concurrency slot."""
        return self.status_code == 429

    def json(self) -> object | None:
        if "json" not in self.content_type:
            return None
        try:
            return json.loads(self.content)
        except ValueError:
            return None

    @property
    def is_invalid_json(self) -> bool:
        """Says JSON, is not: a broken backend, not an answer to store as success."""
        return "json" in self.content_type and self.json() is None

    def error_message(self) -> str:
        """The message of an llama-swap or OpenAI-style error body, else the text."""
        parsed = self.json()
        if isinstance(parsed, dict):
            error = parsed.get("error")
            if isinstance(error, dict) and isinstance(error.get("message"), str):
                return error["message"]
            if isinstance(error, str):
                return error
        return self.content[:500].decode("utf-8", "replace").strip()


def preload_answer(model: str, *, upstream_status: int | None) -> UpstreamAnswer:
    """A preload's stored result: `model` is loaded; `upstream_status`, the
    status llama-swap answered the load with, None when no call was made
    (the model was resident already)."""
    record = {
        "model": model,
        "loaded": True,
        "already_resident": upstream_status is None,
        "upstream_status": upstream_status,
    }
    return UpstreamAnswer(
        status_code=200,
        content_type="application/json",
        content=json.dumps(record).encode(),
        retry_after=None,
    )


def server_slots_request(model: str) -> tuple[str, dict[str, str]]:
    """The path and headers that ask `model`'s server for its slots:
    llama-server's `GET /props` through llama-swap's `/upstream/<model>/props`.
    Ask only while `model` is ready and held by a job of gpusched's (after
    its answer, before its end is written): llama-swap loads a model that is
    not ready, to answer, and no job of gpusched's can unload it meanwhile.
    It carries gpusched's job header, so llama-swap's requests in flight do
    not count it as another client's."""
    return f"{PRELOAD_PATH_PREFIX}{quote(model, safe='/')}/props", {FORWARDED_JOB_HEADER: "slots"}


def server_slots_of(path: str, response: httpx.Response) -> int | None:
    """The slots a `server_slots_request` answer reports (`total_slots`);
    None when it says nothing (another kind of server, an error page);
    UpstreamUnreachable when it could not answer now (429, 5xx)."""
    if response.status_code == 429 or response.status_code >= 500:
        raise UpstreamUnreachable(f"GET {path} answered {response.status_code}")
    if response.status_code != 200:
        return None
    try:
        return slots_from_props(response.json())
    except ValueError:
        return None


class LlamaSwapClient:
    """`auth_headers`: `upstream_auth_headers` of its GPU, sent with every call."""

    def __init__(
        self,
        base_url: str,
        *,
        job_timeout: float,
        probe_timeout: float = 5.0,
        auth_headers: Mapping[str, str] | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.job_timeout = job_timeout
        self.probe_timeout = probe_timeout
        self._sends_key = bool(auth_headers)
        self._http = httpx.Client(base_url=self.base_url, headers=dict(auth_headers or {}))

    def _refused(self, response: httpx.Response, call: str) -> None:
        if key_refused(response.status_code, response.headers.get("www-authenticate")):
            raise key_refused_error(call, sent_key=self._sends_key)

    def close(self) -> None:
        self._http.close()

    def running_states(self) -> dict[str, str]:
        """Every process llama-swap runs (`GET /running`), model → state
        (`starting`, `ready`, `stopping`)."""
        try:
            response = self._http.get("/running", timeout=self.probe_timeout)
            self._refused(response, "GET /running")
            response.raise_for_status()
            return running_entries(response.json())
        except (httpx.TransportError, httpx.HTTPStatusError, ValueError) as exc:
            raise UpstreamUnreachable(f"GET /running failed: {exc!r}") from exc

    def events(self, *, read_timeout: float) -> Iterator[tuple[str, Any]]:
        """llama-swap's `GET /api/events`, message by message: (type, payload
        decoded). Ends when the stream does; UpstreamUnreachable when it
        cannot be opened; httpx errors while it is read (a silence longer
        than `read_timeout` among them) pass through."""
        timeout = httpx.Timeout(read_timeout, connect=self.probe_timeout)
        try:
            stream = self._http.stream("GET", "/api/events", timeout=timeout)
            response = stream.__enter__()
        except httpx.TransportError as exc:
            raise UpstreamUnreachable(f"GET /api/events failed: {exc!r}") from exc
        try:
            self._refused(response, "GET /api/events")
            if response.status_code != 200:
                raise UpstreamUnreachable(f"GET /api/events answered {response.status_code}")
            for _, data in server_sent_events(response.iter_lines()):
                message = event_payload(data)
                if message is not None:
                    yield message
        finally:
            stream.__exit__(None, None, None)

    def served_models(self) -> list[str]:
        """The model ids llama-swap lists at `GET /v1/models`."""
        try:
            response = self._http.get("/v1/models", timeout=self.probe_timeout)
            self._refused(response, "GET /v1/models")
            response.raise_for_status()
            entries = response.json().get("data") or []
        except (httpx.TransportError, httpx.HTTPStatusError, ValueError, AttributeError) as exc:
            raise UpstreamUnreachable(f"GET /v1/models failed: {exc!r}") from exc
        return [str(entry["id"]) for entry in entries if isinstance(entry, dict) and "id" in entry]

    def server_slots(self, model: str) -> int | None:
        """`server_slots_of` the answer to `server_slots_request` (the module
        says when to ask); UpstreamUnreachable: ask again later."""
        path, headers = server_slots_request(model)
        try:
            response = self._http.get(path, timeout=self.probe_timeout, headers=headers)
        except httpx.HTTPError as exc:
            raise UpstreamUnreachable(f"GET {path} failed: {exc!r}") from exc
        return server_slots_of(path, response)

    def forward(self, path: str, body: object, *, job_id: int) -> UpstreamAnswer:
        """POST the job's body to its path and read the whole answer."""
        return self._call("POST", path, body=body, job_id=job_id)

    def preload(self, model: str, *, job_id: int) -> UpstreamAnswer:
        """Load `model` (`GET /upstream/<model>/`, the module says why) and
        say so (`preload_answer`); llama-swap's own refusal (unknown model,
        429, a model that failed to start) is returned as it came."""
        answer = self._call("GET", preload_request_path(model), job_id=job_id)
        if answer.status_code < 400 or (not answer.is_busy and self._ready(model)):
            return preload_answer(model, upstream_status=answer.status_code)
        return answer

    def _ready(self, model: str) -> bool:
        try:
            return self.running_states().get(model) == READY
        except UpstreamUnreachable:
            return False

    def _call(self, method: str, path: str, *, job_id: int, body: object = None) -> UpstreamAnswer:
        timeout = httpx.Timeout(self.job_timeout, connect=self.probe_timeout)
        # The job's id tells its request apart from other clients' in
        # llama-swap's in-flight events (queueapp/upstream/llama_swap_state.py).
        headers = {FORWARDED_JOB_HEADER: str(job_id)}
        try:
            response = self._http.request(method, path, json=body, headers=headers, timeout=timeout)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise UpstreamUnreachable(f"connecting to llama-swap failed: {exc!r}") from exc
        except httpx.TimeoutException as exc:
            raise UpstreamBroken(
                f"llama-swap did not answer within {self.job_timeout:g} s"
            ) from exc
        except httpx.TransportError as exc:
            raise UpstreamBroken(f"the connection to llama-swap broke: {exc!r}") from exc
        self._refused(response, f"{method} {path}")
        return UpstreamAnswer(
            status_code=response.status_code,
            content_type=response.headers.get("content-type", ""),
            content=response.content,
            retry_after=retry_after_seconds(response.headers.get("retry-after")),
        )
