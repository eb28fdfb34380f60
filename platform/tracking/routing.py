"""Websocket routes of the tracking app (collected by config/routing.py)."""

from __future__ import annotations

from django.urls import path

from tracking.consumers import RunConsumer
from tracking.ws_auth import TokenAuthMiddleware

websocket_urlpatterns = [
    # An API token in the handshake's Authorization header authenticates as its user (tracking/ws_auth.py).
    # Any segment: the consumer reads the id (accounts/ids.py) and refuses one that is not, with 4403.
    path("ws/runs/<str:run_id>/", TokenAuthMiddleware(RunConsumer.as_asgi())),
]
