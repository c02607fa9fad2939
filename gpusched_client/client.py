"""`Client`: gpusched's REST API as typed Python calls.

URL and token come from the arguments or from GPUSCHED_URL and
GPUSCHED_TOKEN. Every error answer becomes a GpuschedError carrying the
server's message.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import httpx

FINAL = ("succeeded", "failed", "cancelled")


class GpuschedError(Exception):
    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(f"{status_code}: {message}")
        self.status_code = status_code
        self.message = message


class Client:
    def __init__(
        self, url: str | None = None, token: str | None = None, timeout: float = 30
    ) -> None:
        url = url or os.environ.get("GPUSCHED_URL", "http://127.0.0.1:8000")
        token = token or os.environ.get("GPUSCHED_TOKEN", "")
        if not token:
            raise GpuschedError(401, "no token: pass one or set GPUSCHED_TOKEN")
        self.url = url.rstrip("/")
        self.token = token
        self._http = httpx.Client(
            base_url=self.url, timeout=timeout, headers={"Authorization": f"Bearer {token}"}
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise GpuschedError(0, f"cannot reach gpusched at {self.url}: {exc}") from exc
        if response.status_code >= 400:
            try:
                message = response.json().get("detail") or response.text
            except ValueError:
                message = response.text
            raise GpuschedError(response.status_code, message)
        return response.json() if response.content else None

    def submit(
        self,
        *,
        path: str,
        body: dict[str, Any],
        priority: str | int | None = None,
        chain: dict[str, Any] | None = None,
        callback_url: str | None = None,
    ) -> dict[str, Any]:
        payload: dict[str, Any] = {"path": path, "body": body}
        if chain:
            payload["chain"] = chain
        if callback_url:
            payload["callback_url"] = callback_url
        headers = {"X-LlamaSwap-Priority": str(priority)} if priority is not None else {}
        return self._call("POST", "/api/jobs/", json=payload, headers=headers)

    def get(self, job_id: int) -> dict[str, Any]:
        return self._call("GET", f"/api/jobs/{job_id}/")

    def jobs(self, *, status: str | None = None) -> list[dict[str, Any]]:
        params = {"status": status} if status else {}
        return self._call("GET", "/api/jobs/", params=params)["results"]

    def cancel(self, job_id: int) -> dict[str, Any]:
        return self._call("DELETE", f"/api/jobs/{job_id}/")

    def why(self, job_id: int) -> dict[str, Any]:
        return self._call("GET", f"/api/jobs/{job_id}/why/")

    def queue(self) -> dict[str, Any]:
        return self._call("GET", "/api/queue/")

    def result_bytes(self, job: dict[str, Any]) -> bytes:
        """A stored result file (images, audio, large answers)."""
        response = self._http.get(f"/api/jobs/{job['id']}/result/")
        if response.status_code >= 400:
            raise GpuschedError(response.status_code, response.text)
        return response.content

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
                raise GpuschedError(408, f"job {job_id} still {job['status']} after {timeout} s")
            time.sleep(poll_seconds)
