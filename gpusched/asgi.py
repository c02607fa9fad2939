"""ASGI entry point: Django over HTTP, the live queue over WebSocket, and the
OpenAI-compatible front door's paths as a plain ASGI app in front of Django
(a waiting call there runs no middleware and holds no thread)."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpusched.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from gpusched import server_limits  # noqa: E402
from queueapp.frontdoor import FRONT_DOOR_PATHS, MODELS_PATH, front_door_app  # noqa: E402
from queueapp.live.routing import websocket_urlpatterns  # noqa: E402

server_limits.install()

_FRONT_DOOR = frozenset((*FRONT_DOOR_PATHS, MODELS_PATH))


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
