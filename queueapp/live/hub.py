"""One hub per ASGI process: hears about changes, rebuilds the queue state
once per burst, and pushes it to every viewer connected to this process: a
snapshot on connect, then a delta per version (the parts that changed), or
the full state to a viewer that missed a version. What a viewer gets is the
live view (`dashboard.live_state_for`): the head of the queue and the
viewer's own jobs, so a message does not grow with the queue.

Changes arrive by PostgreSQL LISTEN (default) or as Channels group messages
through Redis (REDIS_URL). Either way a burst of changes (a claim, a finish,
ten submissions) costs one rebuild, not one per viewer or per change.

Deltas are per part (running job, queue, bands, decisions, ...), not per
queued row: each change moves every queued row (its aging, score and
estimated start), so a row-level diff would be nearly the whole queue. A
viewer costs a dictionary lookup: each version's message is encoded once
per audience (staff, each member watching, the public), with shallow-copy
redaction. A page that gets a delta whose `base` is not the version it
holds reconnects, so a client is never out of step.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, Protocol

import psycopg
from channels.db import database_sync_to_async
from django.conf import settings

from queueapp.dashboard import live_state_for, queue_state
from queueapp.live.events import NOTIFY_CHANNEL, listener_connection_params
from queueapp.models import Member

logger = logging.getLogger(__name__)

# Changes that arrive within this long of each other share one rebuild.
COALESCE_SECONDS = 0.02
RECONNECT_SECONDS = 1.0


class Viewer(Protocol):
    async def push(self) -> None: ...


class QueueHub:
    def __init__(self) -> None:
        self.viewers: set[Viewer] = set()
        self.state: dict[str, Any] | None = None
        # The state one version back: deltas are taken against it.
        self.previous_state: dict[str, Any] | None = None
        self.version = 0
        self._pending = False
        self._rebuilding: asyncio.Task | None = None
        self._listener: asyncio.Task | None = None
        # False while nobody watches: changes are not followed then, so the
        # next viewer gets a fresh state, built once however many join.
        self._fresh = False
        self._first_build = asyncio.Lock()
        # The message for each audience (staff, one member, the public) at the
        # current version, encoded once however many tabs that audience has.
        self._messages: dict[tuple[str, object], str] = {}

    async def join(self, viewer: Viewer) -> None:
        """Register a viewer, with a fresh state ready for its first snapshot."""
        self.viewers.add(viewer)
        if not settings.REDIS_URL and (self._listener is None or self._listener.done()):
            self._listener = asyncio.get_running_loop().create_task(self._listen())
        async with self._first_build:
            if not self._fresh:
                await self._rebuild()
                self._fresh = True

    def leave(self, viewer: Viewer) -> None:
        self.viewers.discard(viewer)
        if not self.viewers:
            self._fresh = False
            if self._listener is not None:
                self._listener.cancel()  # closes its connection; the next viewer reopens

    async def stop(self) -> None:
        """Stop listening (tests; a server simply exits)."""
        self.viewers.clear()
        self._fresh = False
        for task in (self._listener, self._rebuilding):
            if task is not None and not task.done():
                task.cancel()
                try:
                    await task
                except (asyncio.CancelledError, Exception):
                    pass

    def changed(self) -> None:
        """Something changed: rebuild soon (once for a burst) and push."""
        self._pending = True
        if self._rebuilding is None or self._rebuilding.done():
            self._rebuilding = asyncio.get_running_loop().create_task(self._rebuild_and_push())

    async def _rebuild_and_push(self) -> None:
        while self._pending:
            await asyncio.sleep(COALESCE_SECONDS)
            self._pending = False
            try:
                await self._rebuild()
            except Exception:
                logger.exception("rebuilding the queue state failed")
                return
            await asyncio.gather(
                *(viewer.push() for viewer in list(self.viewers)), return_exceptions=True
            )

    async def _rebuild(self) -> None:
        state = await database_sync_to_async(queue_state)()
        # While nobody watched, versions were skipped: no delta bridges that.
        self.previous_state = self.state if self._fresh else None
        self.state = state
        self.version += 1
        self._messages = {}

    def message_for(self, kind: str, viewer: Member | None) -> str:
        """The JSON text of this version's `kind` message as `viewer` may see it."""
        key = (kind, _audience(viewer))
        if key not in self._messages:
            assert self.state is not None
            self._messages[key] = json.dumps(
                {"type": kind, "version": self.version, **live_state_for(self.state, viewer)}
            )
        return self._messages[key]

    def delta_for(self, viewer: Member | None) -> str:
        """This version as a JSON merge patch (RFC 7386) of the one before, as
        `viewer` may see both: only the top-level parts that changed (a part
        that is now null or went away is null). The full update when there is
        no version before."""
        if self.previous_state is None:
            return self.message_for("update", viewer)
        key = ("delta", _audience(viewer))
        if key not in self._messages:
            assert self.state is not None
            before = live_state_for(self.previous_state, viewer)
            after = live_state_for(self.state, viewer)
            changes = {part: value for part, value in after.items() if before.get(part) != value}
            changes.update({part: None for part in before.keys() - after.keys()})
            self._messages[key] = json.dumps(
                {
                    "type": "delta",
                    "version": self.version,
                    "base": self.version - 1,
                    "changes": changes,
                }
            )
        return self._messages[key]

    async def _listen(self) -> None:
        """LISTEN on PostgreSQL; reconnects, and treats a reconnect as a change
        (notifications sent while it was away are lost, the state is not)."""
        params = await database_sync_to_async(listener_connection_params)()
        while self.viewers:
            try:
                async with await psycopg.AsyncConnection.connect(
                    **params, autocommit=True
                ) as listener:
                    await listener.execute(f"LISTEN {NOTIFY_CHANNEL}")
                    self.changed()
                    async for _ in listener.notifies():
                        self.changed()
                        if not self.viewers:
                            break
            except (psycopg.Error, OSError) as exc:
                logger.warning("queue listener lost its connection (%s); reconnecting", exc)
                await asyncio.sleep(RECONNECT_SECONDS)


def _audience(viewer: Member | None) -> object:
    """Viewers who see the same redacted state: staff, one member, the public."""
    if viewer is None:
        return None
    return "staff" if viewer.is_staff else viewer.pk


hub = QueueHub()
