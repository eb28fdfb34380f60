"""ASGI entry point: HTTP through Django, websockets through Channels (see config/routing.py). The engine's
metrics POSTs take a shorter path in front of Django (tracking/ingest.py), with the same answers. Every
connection records the server's event loop for the live publishes of sync views (tracking/live.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

_PLATFORM_DIR = str(Path(__file__).resolve().parent.parent)
if _PLATFORM_DIR not in sys.path:
    sys.path.insert(0, _PLATFORM_DIR)
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

from django.core.asgi import get_asgi_application  # noqa: E402

django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from config.routing import websocket_urlpatterns  # noqa: E402
from tracking.ingest import IngestFront  # noqa: E402
from tracking.live import ServerLoop  # noqa: E402

application = ServerLoop(
    ProtocolTypeRouter(
        {
            "http": IngestFront(django_asgi_app),
            "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
        }
    )
)
