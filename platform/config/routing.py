"""Websocket routes. Each app contributes its own list."""

from __future__ import annotations

websocket_urlpatterns: list = []

try:  # the tracking app adds live run streams when it has consumers
    from tracking.routing import websocket_urlpatterns as _tracking_ws

    websocket_urlpatterns += _tracking_ws
except ImportError:
    pass
