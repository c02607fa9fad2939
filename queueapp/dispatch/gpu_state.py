"""The GPU's row kept current with what its llama-swap says.

A dispatcher asks its llama-swap what is resident before a claim (not right
after a job it answered, which says so: `GpuStateRecorder.loaded`) and, now
and then, which models it serves; it records the answers on the GPU's row,
where web servers and the other dispatchers read them. A write happens only
when the answer changes, and a change that could let a waiting job run (the
GPU back, a model served) is announced as work.
"""

from __future__ import annotations

import threading

from queueapp import services


class GpuStateRecorder:
    """Keeps the GPU's row current with what its llama-swap says, writing
    only when that changes."""

    def __init__(self, gpu_id: int) -> None:
        self.gpu_id = gpu_id
        self._last: tuple[bool, str | None, tuple[str, ...] | None] | None = None
        # Written when it changes too: a llama-swap back from down that now
        # refuses the key is unhealthy for another reason, which health shows.
        self._last_error = ""
        self._just_loaded: str | None = None
        # The pass and the threads of its shared slots record.
        self._lock = threading.RLock()

    def loaded(self, model: str) -> None:
        """llama-swap just answered a job of `model`: it has it loaded, and
        the next claim may take that from here instead of asking again."""
        with self._lock:
            self.record(reachable=True, resident=model)
            self._just_loaded = model

    def take_just_loaded(self) -> str | None:
        """The model a job just ran with, once; None: ask llama-swap."""
        with self._lock:
            model, self._just_loaded = self._just_loaded, None
            return model

    def forget(self) -> None:
        """The last write may have been lost (database outage): write the next."""
        with self._lock:
            self._last = None

    def record(
        self,
        *,
        reachable: bool,
        resident: str | None,
        error: str = "",
        served_models: list[str] | None = None,
    ) -> None:
        """`served_models` None: not read this time (the last list stands)."""
        with self._lock:
            self._record(
                reachable=reachable, resident=resident, error=error, served_models=served_models
            )

    def _record(
        self,
        *,
        reachable: bool,
        resident: str | None,
        error: str,
        served_models: list[str] | None,
    ) -> None:
        served = tuple(sorted(set(served_models))) if served_models is not None else None
        if served is None and self._last is not None:
            served = self._last[2]
        if self._last == (reachable, resident, served) and self._last_error == error:
            return
        # Jobs may have waited for this GPU to come back or to serve a model:
        # the other dispatchers and admissions hear of it; a new resident
        # model alone changes nothing they could do.
        new_work = (
            self._last is None or (reachable and not self._last[0]) or served != self._last[2]
        )
        self._last = (reachable, resident, served)
        self._last_error = error
        services.gpu_state_record(
            gpu_id=self.gpu_id,
            reachable=reachable,
            resident_model=resident,
            error=error,
            served_models=served_models,
            announce_work=new_work,
        )
