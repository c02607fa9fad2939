"""ASGI entry point: Django over HTTP, the live queue over WebSocket, and the
OpenAI-compatible front door's paths as a plain ASGI app in front of Django
(a waiting call there runs no middleware and holds no thread)."""

import os
import sys

from django.core.asgi import get_asgi_application

# The thread that ends a front-door job and grants the next one waits for
# PostgreSQL a dozen times per job; each time it needs the GIL back, and a
# busy thread (a Django view, the event loop) holds it up to the switch
# interval (5 ms by default). 0.5 ms keeps that handoff off the GPU's
# critical path (docs/architecture.md, "The call's critical path").
GIL_SWITCH_INTERVAL_SECONDS = 0.0005
sys.setswitchinterval(GIL_SWITCH_INTERVAL_SECONDS)

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
