"""A model's slots, read by the front door as the dispatcher reads them for
its own jobs (queueapp/dispatch/forwarding.py `server_slots_read`).

A GPU that serves only front-door calls would otherwise never have its
server asked. The web process asks after a granted job's answer, before
the job's end is written (`Gateway._finish`): the job still holds the GPU,
so no job of gpusched's can unload the model meanwhile. The caller has its
answer already; only the GPU's next job waits the few milliseconds. Each
web process asks once per GPU and model, and again after ASK_AGAIN_SECONDS
(it does not follow llama-swap's loads, which the dispatcher does).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import httpx

from queueapp import services
from queueapp.dispatch.outcomes import ClaimedJob
from queueapp.errors import DATABASE_ERRORS
from queueapp.frontdoor.exchange import llama_swap_client
from queueapp.upstream.client import (
    UpstreamUnreachable,
    server_slots_of,
    server_slots_request,
)

logger = logging.getLogger(__name__)

# A model's server is asked again this long after its last answer: a server
# restarted with other slots is seen within it.
ASK_AGAIN_SECONDS = 600.0
PROPS_TIMEOUT_SECONDS = 5.0

# (GPU id, model) -> when its server was last asked, on this process's clock.
_asked: dict[tuple[int, str], float] = {}


def slots_due(claim: ClaimedJob) -> bool:
    """Whether the claim's model's server is to be asked now; marks it asked."""
    if claim.gpu_id is None or not claim.upstream_url:
        return False
    key = (claim.gpu_id, claim.model)
    now = time.monotonic()
    if now - _asked.get(key, -math.inf) < ASK_AGAIN_SECONDS:
        return False
    _asked[key] = now
    return True


async def server_slots_read(
    claim: ClaimedJob,
    auth: Mapping[str, str],
    db: Callable[..., Callable[..., Awaitable[Any]]],
) -> None:
    """Ask the claim's model's server for its slots, when due, and record
    them with `db` (the gateway's database runner)."""
    if not slots_due(claim):
        return
    assert claim.gpu_id is not None  # slots_due said so
    path, headers = server_slots_request(claim.model)
    try:
        response = await llama_swap_client(claim.upstream_url).get(
            path, headers={**headers, **auth}, timeout=PROPS_TIMEOUT_SECONDS
        )
        slots = server_slots_of(path, response)
        if slots is not None:  # None: not a server that says; its config's count stands
            await db(services.gpu_server_slots_record, gpu_path=True)(
                gpu_id=claim.gpu_id, model=claim.model, slots=slots
            )
    except (httpx.HTTPError, UpstreamUnreachable, *DATABASE_ERRORS) as exc:
        logger.info("front door: %s's slots not read now: %s", claim.model, exc)
        _asked.pop((claim.gpu_id, claim.model), None)  # asked again after the next call
