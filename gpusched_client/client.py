"""`Client`: gpusched's REST API as typed Python calls.

URL and token come from the arguments or from GPUSCHED_URL and
GPUSCHED_TOKEN. Every error answer raises a subclass of GpuschedError
carrying the server's status and message, so callers can catch `NotFound`,
`RateLimited`, ... or the base class alike.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import quote

import httpx

# A job in one of these has ended; `expired`: its wait bound passed while queued.
FINAL = ("succeeded", "failed", "cancelled", "expired")


class GpuschedError(Exception):
    """An error answer, or none at all (`status_code` 0: gpusched unreachable)."""

    def __init__(self, status_code: int, message: str, retry_after: float | None = None) -> None:
        super().__init__(f"{status_code}: {message}")
        self.status_code = status_code
        self.message = message
        # Seconds the server asked to wait before trying again (Retry-After), if it said.
        self.retry_after = retry_after


class BadRequest(GpuschedError):
    """400: the request was refused as invalid; the message names the field."""


class Unauthorized(GpuschedError):
    """401: no token, or one gpusched does not know."""


class Forbidden(GpuschedError):
    """403: the token is valid but may not do this."""


class NotFound(GpuschedError):
    """404: no such job or chain among the caller's."""


class Conflict(GpuschedError):
    """409: the job is not in a state that allows it (cancelling a started job)."""


class RateLimited(GpuschedError):
    """429: too many queued jobs or requests; `retry_after` says when to try again."""


class Unavailable(GpuschedError):
    """503 (and 502/504), or no connection: gpusched cannot take the request now."""


class WaitTimeout(GpuschedError):
    """`Client.wait` gave up before the job ended (status 408)."""


_BY_STATUS: dict[int, type[GpuschedError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    429: RateLimited,
    502: Unavailable,
    503: Unavailable,
    504: Unavailable,
}


def error_for(status_code: int, message: str, retry_after: float | None = None) -> GpuschedError:
    """The exception for an error answer of this status."""
    kind = _BY_STATUS.get(status_code, GpuschedError)
    return kind(status_code, message, retry_after)


def retry_after_seconds(value: str | None) -> float | None:
    """Retry-After as seconds: a number of seconds or an HTTP date (RFC 9110)."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def _error_message(response: httpx.Response) -> str:
    """The server's `detail`, else the answer's text (a proxy's page, a bare JSON value)."""
    try:
        answer = response.json()
    except ValueError:
        answer = None
    if isinstance(answer, dict) and answer.get("detail"):
        detail = answer["detail"]
        return detail if isinstance(detail, str) else str(detail)
    return response.text.strip() or response.reason_phrase or f"HTTP {response.status_code}"


def _object(answer: Any, what: str) -> dict[str, Any]:
    if not isinstance(answer, dict):
        raise GpuschedError(200, f"{what}: expected a JSON object, got {type(answer).__name__}")
    return answer


def _list(answer: Any, what: str) -> list[dict[str, Any]]:
    if not isinstance(answer, list):
        raise GpuschedError(200, f"{what}: expected a JSON list, got {type(answer).__name__}")
    return answer


class Client:
    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        timeout: float = 30,
        *,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        url = url or os.environ.get("GPUSCHED_URL", "http://127.0.0.1:8000")
        token = token or os.environ.get("GPUSCHED_TOKEN", "")
        if not token:
            raise Unauthorized(401, "no token: pass one or set GPUSCHED_TOKEN")
        self.url = url.rstrip("/")
        self.token = token
        self.transport = transport  # httpx's own when None; tests pass a MockTransport
        self._http = httpx.Client(
            base_url=self.url,
            timeout=timeout,
            headers={"Authorization": f"Bearer {token}"},
            transport=transport,
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise Unavailable(0, f"cannot reach gpusched at {self.url}: {exc}") from exc
        if response.status_code >= 400:
            raise error_for(
                response.status_code,
                _error_message(response),
                retry_after_seconds(response.headers.get("Retry-After")),
            )
        return response

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self._send(method, path, **kwargs)
        if not response.content:
            return None
        try:
            return response.json()
        except ValueError:
            # Something other than gpusched answered (a proxy's page, a wrong URL).
            text = response.text.strip()[:200]
            raise GpuschedError(
                response.status_code, f"not a JSON answer from {self.url}{path}: {text}"
            ) from None

    def submit(
        self,
        *,
        path: str,
        body: dict[str, Any],
        priority: str | int | None = None,
        chain: dict[str, Any] | None = None,
        callback_url: str | None = None,
        max_wait: float | None = None,
    ) -> dict[str, Any]:
        """Queue a job. `max_wait`: seconds it may wait to start; a job the
        forecast cannot start within it is refused (503, GpuschedError with
        its Retry-After), one still queued past it ends `expired`."""
        payload: dict[str, Any] = {"path": path, "body": body}
        if chain:
            payload["chain"] = chain
        if callback_url:
            payload["callback_url"] = callback_url
        headers = {"X-LlamaSwap-Priority": str(priority)} if priority is not None else {}
        if max_wait is not None:
            headers["X-Gpusched-Max-Wait"] = f"{max_wait:g}"
        answer = self._call("POST", "/api/jobs/", json=payload, headers=headers)
        return _object(answer, "submit")

    def preload(
        self,
        model: str,
        *,
        gpu: str | None = None,
        priority: str | int | None = None,
        callback_url: str | None = None,
    ) -> dict[str, Any]:
        """Queue a job that only loads `model` (on GPU `gpu` alone when
        named), at background priority (-100) unless `priority` says otherwise."""
        payload: dict[str, Any] = {"model": model}
        if gpu:
            payload["gpu"] = gpu
        if callback_url:
            payload["callback_url"] = callback_url
        headers = {"X-LlamaSwap-Priority": str(priority)} if priority is not None else {}
        answer = self._call("POST", "/api/preload/", json=payload, headers=headers)
        return _object(answer, "preload")

    def get(self, job_id: int) -> dict[str, Any]:
        return _object(self._call("GET", f"/api/jobs/{job_id}/"), f"job {job_id}")

    def jobs(self, *, status: str | None = None) -> list[dict[str, Any]]:
        """The caller's newest jobs (at most 100), optionally of one status."""
        params = {"status": status} if status else {}
        results = _object(self._call("GET", "/api/jobs/", params=params), "jobs").get("results")
        if not isinstance(results, list):
            raise GpuschedError(200, "jobs: the answer has no `results` list")
        return results

    def cancel(self, job_id: int) -> dict[str, Any]:
        return _object(self._call("DELETE", f"/api/jobs/{job_id}/"), f"cancel {job_id}")

    def why(self, job_id: int, *, as_of: str | None = None) -> dict[str, Any]:
        """Why a job waited; `as_of` (ISO 8601) tells a queued job's wait at
        that instant instead of now."""
        params = {"as_of": as_of} if as_of is not None else {}
        answer = self._call("GET", f"/api/jobs/{job_id}/why/", params=params)
        return _object(answer, f"why {job_id}")

    def queue(self) -> dict[str, Any]:
        return _object(self._call("GET", "/api/queue/"), "queue")

    def gpus(self) -> list[dict[str, Any]]:
        """Each GPU: name, health, loaded model, running job(s), models served."""
        return _list(self._call("GET", "/api/gpus/"), "gpus")

    def models(self) -> list[dict[str, Any]]:
        """Each model some GPU serves: name, parallel slots, the GPUs serving it."""
        return _list(self._call("GET", "/api/models/"), "models")

    def chain(self, chain_id: str) -> dict[str, Any]:
        """A chain's progress: units submitted, done, queued, running, ..."""
        answer = self._call("GET", f"/api/chains/{quote(chain_id, safe='')}/")
        return _object(answer, f"chain {chain_id}")

    def chain_cancel(self, chain_id: str) -> int:
        """Cancel the chain's queued units; returns how many."""
        answer = self._call("DELETE", f"/api/chains/{quote(chain_id, safe='')}/")
        return int(_object(answer, f"cancel chain {chain_id}").get("cancelled", 0))

    def result_bytes(self, job: dict[str, Any]) -> bytes:
        """A stored result file (images, audio, large answers)."""
        return self._send("GET", f"/api/jobs/{job['id']}/result/").content

    def wait(
        self,
        job_id: int,
        *,
        on_change: Callable[[dict[str, Any]], None] | None = None,
        poll_seconds: float = 0.5,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Poll until the job ends; `on_change(job)` sees each new state or position."""
        deadline = None if timeout is None else time.monotonic() + timeout
        last: tuple[Any, ...] | None = None
        while True:
            job = self.get(job_id)
            seen = (job["status"], (job.get("estimate") or {}).get("position"))
            if seen != last and on_change is not None:
                on_change(job)
            last = seen
            if job["status"] in FINAL:
                return job
            if deadline is not None and time.monotonic() > deadline:
                raise WaitTimeout(408, f"job {job_id} still {job['status']} after {timeout} s")
            time.sleep(poll_seconds)  # between polls of the job, up to the deadline if any
