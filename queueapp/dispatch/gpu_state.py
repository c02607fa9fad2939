"""The GPU's row kept current with what its llama-swap says.

A dispatcher asks its llama-swap what runs before a claim (not right after
a job it answered, which says so: `GpuStateRecorder.loaded`), follows its
events and re-reads `/running` now and then (queueapp/dispatch/
upstream_watch.py), and, less often, reads which models it serves; it
records the answers on the GPU's row, where web servers and the other
dispatchers read them. What llama-swap runs is kept in one
`LlamaSwapState` that all of them update. A write happens only when the
reading changes, and a change that could let a waiting job run (the GPU
back, a model served) is announced as work.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping

from queueapp import services
from queueapp.upstream.llama_swap_state import LlamaSwapState, ModelsRunning, resident_change

logger = logging.getLogger(__name__)


class GpuStateRecorder:
    """Keeps the GPU's row current with what its llama-swap says, writing
    only when that changes."""

    def __init__(self, gpu_id: int, *, gpu_name: str) -> None:
        self.gpu_id = gpu_id
        self.gpu_name = gpu_name
        self.state = LlamaSwapState()
        self._last: tuple[bool, ModelsRunning | None, tuple[str, ...] | None] | None = None
        # Written when it changes too: a llama-swap back from down that now
        # refuses the key is unhealthy for another reason, which health shows.
        self._last_error = ""
        self._just_loaded: str | None = None
        # The ready set last written from a reading, for the load/unload log:
        # None until one is (what ran before gpusched started is no change),
        # kept through `forget` and through llama-swap being unreachable.
        self._resident: tuple[str, ...] | None = None
        # The models whose server was asked for its slots since llama-swap
        # last unloaded a model (`slots_unasked`).
        self._slots_asked: set[str] = set()
        # The pass, the threads of its shared slots and its watch record.
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

    def slots_unasked(self, model: str) -> bool:
        """Whether `model`'s server is to be asked for its slots: not asked
        since llama-swap last unloaded a model (a model loaded again is a new
        server, which may have other slots). Marks it asked."""
        with self._lock:
            if model in self._slots_asked:
                return False
            self._slots_asked.add(model)
            return True

    def slots_not_recorded(self, model: str) -> None:
        """What `model`'s server said could not be had or recorded: ask again."""
        with self._lock:
            self._slots_asked.discard(model)

    def forget(self) -> None:
        """The last write may have been lost (database outage): write the next."""
        with self._lock:
            self._last = None

    def running_read(self, states: Mapping[str, str]) -> str | None:
        """`GET /running` answered `states`: record them; the model that
        became ready last."""
        with self._lock:
            self.state.running_read(states)
            self.record(reachable=True)
            return self.state.reading().latest_ready

    def changed(self) -> None:
        """An event changed `state`: record it."""
        with self._lock:
            self.record(reachable=True)

    def record(
        self,
        *,
        reachable: bool,
        resident: str | None = None,
        error: str = "",
        served_models: list[str] | None = None,
    ) -> None:
        """`resident`: a model known to be ready; `served_models` None: not
        read this time (the last list stands)."""
        with self._lock:
            if reachable and resident is not None:
                self.state.model_answered(resident)
            self._record(reachable=reachable, error=error, served_models=served_models)

    def _record(self, *, reachable: bool, error: str, served_models: list[str] | None) -> None:
        served = tuple(sorted(set(served_models))) if served_models is not None else None
        if served is None and self._last is not None:
            served = self._last[2]
        # Unreachable, nothing is known to run there.
        running = self.state.reading() if reachable else None
        if self._last == (reachable, running, served) and self._last_error == error:
            return
        # Jobs may have waited for this GPU to come back or to serve a model:
        # the other dispatchers and admissions hear of it; a new resident
        # model alone changes nothing they could do.
        new_work = (
            self._last is None or (reachable and not self._last[0]) or served != self._last[2]
        )
        self._last = (reachable, running, served)
        self._last_error = error
        services.gpu_state_record(
            gpu_id=self.gpu_id,
            reachable=reachable,
            resident_model=running.latest_ready if running else None,
            error=error,
            served_models=served_models,
            running=running,
            announce_work=new_work,
        )
        if running is not None:
            self._log_resident_change(running.ready)

    def _log_resident_change(self, ready: tuple[str, ...]) -> None:
        if self._resident is not None and set(self._resident) - set(ready):
            self._slots_asked.clear()  # an unload: a model loaded again is asked again
        change = resident_change(self._resident, ready) if self._resident is not None else None
        if change:
            logger.info("%s: llama-swap %s", self.gpu_name, change)
        self._resident = ready
