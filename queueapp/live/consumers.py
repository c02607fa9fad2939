"""`/ws/queue/`: the live queue, with the same visibility rules as GET /api/queue/.

A viewer is a member logged in to the pages (session), an operator signed in
to the admin, or a client that sends `{"type": "auth", "token": "<api token>"}`
as its first message (tokens stay out of URLs and access logs). Anonymous
viewers are refused unless the operator enables the public dashboard.
"""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from queueapp.live.events import GROUP
from queueapp.live.hub import hub
from queueapp.models import Member
from queueapp.pages import SESSION_MEMBER
from queueapp.selectors import member_by_token, policy_get, viewer_from_session

CLOSE_UNAUTHORISED = 4401


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

    async def connect(self) -> None:
        await self.accept()
        self.viewer, public = await _viewer_from_scope(self.scope)
        if self.viewer is not None or public:
            await self._join()
        else:
            await self.send_json(
                {"type": "auth_required", "message": 'send {"type": "auth", "token": "..."}'}
            )

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        if self.joined or not isinstance(content, dict) or content.get("type") != "auth":
            return
        self.viewer = await database_sync_to_async(member_by_token)(str(content.get("token", "")))
        if self.viewer is None:
            await self.send_json({"type": "error", "message": "invalid token"})
            await self.close(code=CLOSE_UNAUTHORISED)
            return
        await self._join()

    async def _join(self) -> None:
        self.joined = True
        if self.channel_layer is not None:
            await self.channel_layer.group_add(GROUP, self.channel_name)
        await hub.join(self)
        await self.send(text_data=hub.message_for("snapshot", self.viewer))

    async def disconnect(self, code: int) -> None:
        hub.leave(self)
        if self.joined and self.channel_layer is not None:
            await self.channel_layer.group_discard(GROUP, self.channel_name)

    async def queue_changed(self, event: dict[str, Any]) -> None:
        """A change announced through the channel layer (REDIS_URL)."""
        hub.changed()

    async def push(self) -> None:
        await self.send(text_data=hub.message_for("update", self.viewer))
