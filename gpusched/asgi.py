"""ASGI entry point: Django over HTTP, the live queue over WebSocket, and the
OpenAI-compatible front door's paths as a plain ASGI app in front of Django
(a waiting call there runs no middleware and holds no thread)."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpusched.settings")
django_asgi_app = get_asgi_application()

import json  # noqa: E402

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from gpusched import server_limits  # noqa: E402
from queueapp.frontdoor import FRONT_DOOR_PATHS, MODELS_PATH, front_door_app  # noqa: E402
from queueapp.frontdoor.answers import Answer  # noqa: E402
from queueapp.job_body import (  # noqa: E402
    REST_ENVELOPE_BYTES,
    front_door_body_limit,
    rest_body_limit,
)
from queueapp.live.routing import websocket_urlpatterns  # noqa: E402

_FRONT_DOOR = frozenset((*FRONT_DOOR_PATHS, MODELS_PATH))


def body_refusal(path: str, size: int) -> bytes | None:
    """The web server's own 413 for a body over its path's limit, in the
    shape the path answers in: the same limits the application applies
    (queueapp/job_body.py), applied before the body is stored."""
    if path in _FRONT_DOOR:
        limit = front_door_body_limit(path)
        if size <= limit.bytes:
            return None
        message = limit.refusal(size, path)
        body = Answer.error(413, message, "invalid_request_error", "request_too_large").body
    else:
        # Every other path takes at most a REST job with its envelope.
        limit = rest_body_limit()
        if size <= limit.bytes + REST_ENVELOPE_BYTES:
            return None
        body = json.dumps({"detail": f"body: {limit.refusal(size, path)}"}).encode()
    return server_limits.http_answer(413, "Content Too Large", body, "application/json")


server_limits.install(body_refusal)


async def http_app(scope, receive, send):
    if scope["path"] in _FRONT_DOOR:
        await front_door_app(scope, receive, send)
    else:
        await django_asgi_app(scope, receive, send)


application = ProtocolTypeRouter(
    {
        "http": http_app,
        # Sessions (the pages' token login, the admin) identify viewers; the
        # origin check keeps other sites' pages from reading the queue.
        "websocket": AllowedHostsOriginValidator(
            AuthMiddlewareStack(URLRouter(websocket_urlpatterns))
        ),
    }
)
