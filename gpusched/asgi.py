"""ASGI entry point: Django over HTTP, the live queue over WebSocket."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gpusched.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from gpusched import server_limits  # noqa: E402
from queueapp.live.routing import websocket_urlpatterns  # noqa: E402

server_limits.install()

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        # Sessions (the pages' token login, the admin) identify viewers; the
        # origin check keeps other sites' pages from reading the queue.
        "websocket": AllowedHostsOriginValidator(
            AuthMiddlewareStack(URLRouter(websocket_urlpatterns))
        ),
    }
)
