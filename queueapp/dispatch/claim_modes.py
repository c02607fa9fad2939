"""Who claims a GPU, and what that changes about the claim (claim.py).

Three callers run the same steps: the GPU's dispatcher in a transaction of
its own, the dispatcher again inside the transaction that ended the GPU's
last job, and a front-door web process for its own waiting callers. They
differ in whether they may wait for a lock, which resident model affinity
is scored for, and whose jobs they may grant.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ByDispatcher:
    """The GPU's dispatcher, in a transaction of its own: it waits for the
    GPU's claim lock, and on its last try for the member's lines too."""

    resident_model: str | None
    wait_for_lines: bool = False
    waits = True


@dataclass(frozen=True)
class InEndTransaction:
    """The dispatcher, in the transaction that ended the GPU's last job: it
    holds that job's row, so it only tries every lock."""

    resident_model: str | None
    wait_for_lines = False
    waits = False


@dataclass(frozen=True)
class ForGateway:
    """A front-door web process, for its own waiting callers, in the
    transaction that queued or ended a call: it only tries every lock,
    scores affinity by the resident model the dispatcher last recorded, and
    grants only one of `gateway`'s jobs."""

    gateway: int
    wait_for_lines = False
    waits = False


ClaimMode = ByDispatcher | InEndTransaction | ForGateway


def resident_model_of(mode: ClaimMode, *, recorded: str) -> str | None:
    """The model swap affinity is scored for: the dispatcher's own reading
    of llama-swap, or for a gateway the one the dispatcher last recorded."""
    if isinstance(mode, ForGateway):
        return recorded or None
    return mode.resident_model
