"""`/ws/queue/`: the live queue, with the same visibility rules as GET /api/queue/.

A viewer is a member logged in to the pages (session), an operator signed in
to the admin, or a client that sends `{"type": "auth", "token": "<api token>"}`
as its first message (tokens stay out of URLs and access logs). Anonymous
viewers are refused unless the operator enables the public dashboard.

The live state lists the head of the queue; a viewer reads further back with
`{"type": "queue_page", "offset": N, "limit": M}`, answered once (not kept
live) with the jobs at positions N + 1 to N + M.
"""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from queueapp.dashboard import QueuePage, page_for, queue_page
from queueapp.errors import InvalidInput
from queueapp.live.events import GROUP
from queueapp.live.hub import hub
from queueapp.logins import TooManyFailedLogins, member_login
from queueapp.models import Member
from queueapp.pages import SESSION_MEMBER
from queueapp.selectors import policy_get, viewer_from_session

CLOSE_UNAUTHORISED = 4401
CLOSE_TOO_MANY_FAILURES = 4429


@database_sync_to_async
def _viewer_from_scope(scope: dict[str, Any]) -> tuple[Member | None, bool]:
    """(viewer, anonymous allowed) from the session, the admin login, the policy."""
    session = scope.get("session")
    viewer = viewer_from_session(
        member_id=session.get(SESSION_MEMBER) if session is not None else None,
        user=scope.get("user"),
    )
    return viewer, viewer is None and policy_get().public_dashboard


class QueueConsumer(AsyncJsonWebsocketConsumer):
    viewer: Member | None = None
    joined = False
    # The hub version this viewer last received in full or by delta.
    sent_version = -1

    async def connect(self) -> None:
        await self.accept()
        self.viewer, public = await _viewer_from_scope(self.scope)
        if self.viewer is not None or public:
            await self._join()
        else:
            await self.send_json(
                {"type": "auth_required", "message": 'send {"type": "auth", "token": "..."}'}
            )

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        # A frame that is not JSON (binary, garbage, nested past the parser's
        # depth) is answered, not allowed to end the connection with a traceback.
        try:
            content = await self.decode_json(text_data) if text_data else None
        except (ValueError, RecursionError):
            content = None
        if content is None:
            await self.send_json({"type": "error", "message": "send JSON text frames"})
            return
        await self.receive_json(content)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        if not isinstance(content, dict):
            return
        if self.joined and content.get("type") == "queue_page":
            await self._send_queue_page(content)
            return
        if self.joined or content.get("type") != "auth":
            return
        client = (self.scope.get("client") or ["unknown"])[0]
        try:
            self.viewer = await database_sync_to_async(member_login)(
                token=str(content.get("token", "")), client=str(client)
            )
        except TooManyFailedLogins as exc:
            await self.send_json(
                {"type": "error", "message": exc.message, "retry_after": exc.retry_after}
            )
            await self.close(code=CLOSE_TOO_MANY_FAILURES)
            return
        if self.viewer is None:
            await self.send_json({"type": "error", "message": "invalid token"})
            await self.close(code=CLOSE_UNAUTHORISED)
            return
        await self._join()

    async def _send_queue_page(self, content: dict[str, Any]) -> None:
        # Messages of one connection are handled in turn: a viewer has at
        # most one page being read, however fast it asks.
        try:
            page = QueuePage.parse(offset=content.get("offset"), limit=content.get("limit"))
        except InvalidInput as exc:
            await self.send_json({"type": "error", "message": exc.message, "field": exc.field})
            return
        answer = await database_sync_to_async(queue_page)(page)
        await self.send_json({"type": "queue_page", **page_for(answer, self.viewer)})

    async def _join(self) -> None:
        self.joined = True
        if self.channel_layer is not None:
            await self.channel_layer.group_add(GROUP, self.channel_name)
        await hub.join(self)
        self.sent_version = hub.version
        await self.send(text_data=hub.message_for("snapshot", self.viewer))

    async def disconnect(self, code: int) -> None:
        hub.leave(self)
        if self.joined and self.channel_layer is not None:
            await self.channel_layer.group_discard(GROUP, self.channel_name)

    async def queue_changed(self, event: dict[str, Any]) -> None:
        """A change announced through the channel layer (REDIS_URL)."""
        hub.changed()

    async def push(self) -> None:
        if self.sent_version >= hub.version:
            return  # its snapshot already showed this version
        if self.sent_version == hub.version - 1:
            message = hub.delta_for(self.viewer)
        else:
            message = hub.message_for("update", self.viewer)
        self.sent_version = hub.version
        await self.send(text_data=message)
