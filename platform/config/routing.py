"""Websocket routes. Each app contributes its own list."""

from __future__ import annotations

from tracking.routing import websocket_urlpatterns as _tracking_ws

websocket_urlpatterns: list = [*_tracking_ws]
