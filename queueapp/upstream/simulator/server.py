"""llama-swap's HTTP surface in front of the simulated GPU.

Routes, model selection, ``/running``, ``/v1/models``, ``/health``, the error envelope,
the 429 concurrency-limit answer, ``/api/events``, the unloads and ``ttl`` follow
llama-swap, so the dispatcher is exercised exactly as it would be against the real proxy.
The handler only speaks HTTP: what the GPU does with a request is `SimulatedGpu`'s, what
the answer holds is `payloads`', which routes exist and what an error looks like is
`routes`', and how events are framed and fanned out is `events`'.

llama-swap source files matched (mostlygeek/llama-swap):
  internal/server/server.go         model routes (JSON vs multipart), GET routes, /health
  internal/server/api.go            /v1/models records, /running entries, /health body
  internal/swaputil/http.go         model lookup by Content-Type, error messages and statuses,
                                    Accept-dependent error format
  internal/swaputil/httperror.go    error envelope, status -> type/code, 429 + Retry-After
  internal/router/scheduler/fifo.go unknown model is refused before the concurrency check;
                                    OnUnload: a request waiting for the load gets an error
  internal/process/process.go       process states ("starting", "ready", "stopping")
  internal/process/process_command.go  ttl: unload once idle that long after the last
                                    request's end (lastUse); the proxy's recovered abort
  internal/server/api.go            /upstream/<model>/ (handleUpstream), the load that
                                    ui/src/stores/api.ts loadModel and startPreload make;
                                    /running's fields (handleRunning), GET /unload
  internal/server/apigroup.go       /api/events (handleAPIEvents: framing, connect payload,
                                    message types), modelStatus records, the unload routes'
                                    answers (handleAPIUnloadAll, handleAPIUnloadModel)
  internal/server/inflight.go       inflight records, upsert/remove/snapshot, 250 ms updates
  internal/server/captures.go       request headers: first value, sensitive ones redacted
  internal/swaputil/events.go       InFlightRequestsEvent, InflightRequestEntry fields
  internal/router/base.go           Unload does not wait for requests in flight
The events, unload, inflight and ttl entries were read at tag v250.

What a request in flight on a model being unloaded sees (llama-swap kills the model's server
without waiting, base.go ``Unload``): waiting for the model's load, a 500 with the error
envelope and ``MSG_LOAD_UNLOADED``; being computed, a 502 with an empty body (Go's
``httputil.ReverseProxy`` default error handler, as process_command.go sets none); streaming,
its stream ends at once, cleanly (the last chunk is sent) but without ``data: [DONE]``,
because process_command.go recovers the proxy's ``http.ErrAbortHandler`` and the handler
returns normally. The log records 500, 502, and 200 for the stream.

Simulator-only: ``POST /sim/events`` with ``{"enabled": false}`` (or ``true``) turns the event
stream off or on (``events.py`` says what off means); ``GET /sim/events`` reads the switch.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from queueapp.upstream.simulator.api_keys import ApiKeyGate
from queueapp.upstream.simulator.config import (
    SwapConfig,
    config_parallel,
    config_size_scaled,
    config_ttls,
    served_seconds,
)
from queueapp.upstream.simulator.events import EventHub
from queueapp.upstream.simulator.gpu import SimulatedGpu
from queueapp.upstream.simulator.handler import SimulatorHandler, carry_out
from queueapp.upstream.simulator.http_server import SimulatorHTTPServer
from queueapp.upstream.simulator.residency import RoutedGpu

TTL_CHECK_S = 0.1  # how often idle models are checked against their ttl


class LlamaSwapSimulator:
    """One simulated GPU behind llama-swap: one resident model, up to ``parallel`` requests
    of it at once (``parallel_models`` overrides that per model; see `SimulatedGpu`).
    ``ttl`` gives models llama-swap's idle unload, ``stop_seconds`` is how long an unload's
    stop takes, ``events`` False starts with the event stream off, and ``size_scaled``
    makes every model's run time follow the request's size (sizing.py)."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        models: Mapping[str, float] | None = None,
        *,
        default_seconds: float = 1.0,
        accept_any_model: bool = False,
        swap_seconds: float = 1.0,
        initial_model: str | None = None,
        parallel: int = 1,
        parallel_models: Mapping[str, int] | None = None,
        ttl: Mapping[str, int] | None = None,
        stop_seconds: float = 0.0,
        events: bool = True,
        on_request: Callable[[dict[str, Any]], None] | None = None,
        api_keys: Sequence[str] = (),
        config: SwapConfig | None = None,
        size_scaled: bool = False,
    ) -> None:
        self.host = host
        self.api_keys = ApiKeyGate(api_keys)  # llama-swap's apiKeys (api_keys.py)
        options: dict[str, Any] = dict(
            default_seconds=default_seconds,
            swap_seconds=swap_seconds,
            initial_model=initial_model,
            parallel=parallel,
            parallel_models=parallel_models,
            stop_seconds=stop_seconds,
            events=EventHub(enabled=events),
            on_request=on_request,
        )
        self.gpu: SimulatedGpu
        if config is None:
            options.update(accept_any_model=accept_any_model, ttl=ttl, size_scaled=size_scaled)
            self.gpu = SimulatedGpu(models, **options)
        else:
            if accept_any_model:
                raise ValueError("--accept-any-model: a config names the models it serves")
            if ttl:
                raise ValueError("--ttl: a config gives each model's ttl itself")
            # The slots a model's cmd sets (-np 4), unless given here.
            options["parallel_models"] = {**config_parallel(config), **(parallel_models or {})}
            self.gpu = RoutedGpu(
                config,
                models=served_seconds(config, models or {}, default_seconds=default_seconds),
                ttl=config_ttls(config),
                size_scaled=size_scaled or config_size_scaled(config),
                **options,
            )
        self._requested_port = port
        self._stopping = threading.Event()
        self._httpd: SimulatorHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._reaper: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> LlamaSwapSimulator:
        """Bind and serve in a background thread; the socket is listening on return."""
        if self._httpd is not None:
            raise RuntimeError("simulator already started")
        self._stopping.clear()
        httpd = SimulatorHTTPServer((self.host, self._requested_port), SimulatorHandler)
        httpd.gpu, httpd.stopping, httpd.api_keys = self.gpu, self._stopping, self.api_keys
        self._httpd = httpd
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True
        )
        self._thread.start()
        if self.gpu.uses_ttl:
            self._reaper = threading.Thread(target=self._unload_idle, daemon=True)
            self._reaper.start()
        return self

    def _unload_idle(self) -> None:
        """Unload the resident model once its ttl has run out (process.go's ttl goroutine)."""
        while not self._stopping.wait(TTL_CHECK_S):
            unloading = self.gpu.begin_ttl_unload()
            if unloading is not None:
                carry_out(self.gpu, unloading, self._stopping)

    def stop(self) -> None:
        """Stop serving; jobs still sleeping finish at once."""
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        self._stopping.set()
        self.gpu.halt()
        httpd.shutdown()
        httpd.server_close()
        httpd.drop_connections()
        for thread in (self._thread, self._reaper):
            if thread is not None:
                thread.join(timeout=5)
        self._reaper = None

    def __enter__(self) -> LlamaSwapSimulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("simulator not started")
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    # -- the GPU, as tests and callers read it ---------------------------------------------

    @property
    def models(self) -> dict[str, float]:
        return self.gpu.models

    @property
    def swap_seconds(self) -> float:
        return self.gpu.swap_seconds

    def seconds_for(self, model: str) -> float | None:
        return self.gpu.seconds_for(model)

    def running(self) -> dict[str, Any]:
        return self.gpu.running()

    def list_models(self) -> dict[str, Any]:
        return self.gpu.list_models()

    def log(self) -> list[dict[str, Any]]:
        return self.gpu.log()

    def reset_log(self) -> None:
        self.gpu.reset_log()

    def sent(self, seq: int) -> dict[str, Any] | None:
        return self.gpu.sent(seq)

    @property
    def events_enabled(self) -> bool:
        return self.gpu.events.enabled
