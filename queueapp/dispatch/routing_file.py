"""llama-swap's config file (LLAMA_SWAP_CONFIG), read for its routing.

The GPU's dispatcher reads the file, builds its routing
(queueapp/policy/routing.py) and records on the GPU's row the parts of the
config the routing needs (`routing_parts`), so a web server on another
machine, without the file, builds the same routing from the row. It looks
at the file's modification time on its housekeeping clock and reads it
again when it changed, so llama-swap's own config reload is seen.

A config gpusched cannot use (no file, a YAML error, a routing llama-swap
would refuse) is one line naming the GPU, the file, the key and the
reason: logged once per process and per change (a pass lasts minutes, the
process days), stored as the row's `routing_error`, and shown by
`GET /api/health/` as `degraded`. Jobs go on as before: the row's routing
is null then, as without a config. Nothing here is an error the pass stops
for.

The same read gives each model's slots as its `cmd` or `env` sets them
(`-np 4`: queueapp/policy/server_slots.py), recorded with the routing.

A config read whose concurrencyLimit is below a model's `parallel` is one
warning line too (once per change), and `degraded` health, which health
works out from the rows (queueapp/policy/concurrency.py).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from queueapp import selectors, services
from queueapp.models import Gpu
from queueapp.policy.concurrency import parallels_over_limit
from queueapp.policy.routing import RoutingConfigError, routing_from_config, routing_parts
from queueapp.policy.server_slots import ParallelSource, config_slots

logger = logging.getLogger(__name__)

# How often the file's modification time is looked at.
ROUTING_CHECK_SECONDS = 3.0

# The line last logged for each GPU by this process: a new pass of the
# same process does not log it again.
_logged: dict[str, str] = {}
# The same for the line of models whose parallel is above their limit.
_logged_over_limit: dict[str, str] = {}


@dataclass(frozen=True)
class RoutingRead:
    """The file read: the parts to store, or the line that says why not, and
    the slots each model's `cmd` or `env` sets (policy/server_slots.py)."""

    routing: dict[str, object] | None
    error: str
    slots: dict[str, int] = field(default_factory=dict)


def routing_read(path: str, *, gpu: str) -> RoutingRead:
    """Read llama-swap's config at `path` for GPU `gpu`'s routing."""
    where = f"{gpu}: {path}"
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "it is not UTF-8 text"
        return RoutingRead(None, f"{where}: cannot read: {reason}")
    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        return RoutingRead(None, f"{where}: not valid YAML: {_yaml_problem(exc)}")
    if not isinstance(config, Mapping):
        found = type(config).__name__
        return RoutingRead(None, f"{where}: (top level): must be a mapping, got {found}")
    try:
        routing_from_config(config)
    except RoutingConfigError as exc:
        return RoutingRead(None, _one_line(f"{where}: {exc.key}: {exc.reason}"))
    return RoutingRead(routing_parts(config), "", config_slots(config))


def _yaml_problem(exc: yaml.YAMLError) -> str:
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        return _one_line(f"line {mark.line + 1}, column {mark.column + 1}: {exc.problem}")
    return _one_line(str(exc))


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _config_slots_of(gpu: Gpu) -> dict[str, int]:
    """The config's slots the GPU's row holds."""
    return {
        model: entry[ParallelSource.CONFIG.value]
        for model, entry in (gpu.model_slots or {}).items()
        if isinstance(entry, dict) and ParallelSource.CONFIG.value in entry
    }


class RoutingFile:
    """One GPU's config file, followed: `check` reads it when it changed and
    records what it found, writing the row only when that differs."""

    def __init__(self, gpu: Gpu, path: str | None) -> None:
        self.gpu_id = gpu.pk
        self.gpu_name = gpu.name
        self.path = path
        # What the row holds: a new pass writes nothing when it is current.
        self._recorded = RoutingRead(gpu.routing, gpu.routing_error, _config_slots_of(gpu))
        # The file's (mtime, size, inode) when last recorded; None: read it.
        self._version: tuple[int, int, int] | None = None

    def check(self) -> None:
        if self.path is None:
            self._record(RoutingRead(None, ""))  # no config: as before
            return
        version = self._file_version(self.path)
        if version is not None and version == self._version:
            return
        self._record(routing_read(self.path, gpu=self.gpu_name))
        self._version = version  # after the write: a failed one is tried again

    @staticmethod
    def _file_version(path: str) -> tuple[int, int, int] | None:
        try:
            found = os.stat(path)
        except OSError:
            return None  # missing: looked at again on every check
        return (found.st_mtime_ns, found.st_size, found.st_ino)

    def _record(self, read: RoutingRead) -> None:
        if read.error and _logged.get(self.gpu_name) != read.error:
            logger.error("llama-swap's config cannot be used: %s", read.error)
        elif not read.error and _logged.get(self.gpu_name):
            logger.info("%s: llama-swap's config %s is used again", self.gpu_name, self.path)
        _logged[self.gpu_name] = read.error
        # Before the row's check: a restarted process reports it too.
        self._report_parallels_over_limit(read.routing)
        if read == self._recorded:
            return
        services.gpu_routing_record(
            gpu_id=self.gpu_id, routing=read.routing, error=read.error, slots=read.slots
        )
        self._recorded = read

    def _report_parallels_over_limit(self, routing: dict[str, object] | None) -> None:
        """Log the models whose `parallel` the config just read puts above
        their concurrencyLimit, once per change of that line."""
        line = ""
        if routing is not None:
            try:
                configs = {self.gpu_name: routing_from_config(routing)}
            except RoutingConfigError:
                configs = {}  # the parts of a config it accepted: not expected
            over = parallels_over_limit(configs, selectors.operator_parallels())
            line = "; ".join(str(entry) for entry in over)
        if line and _logged_over_limit.get(self.gpu_name) != line:
            logger.warning("%s", line)
        _logged_over_limit[self.gpu_name] = line
