"""Websocket routes of the tracking app (collected by config/routing.py)."""

from __future__ import annotations

from django.urls import path

from tracking.consumers import RunConsumer

websocket_urlpatterns = [
    path("ws/runs/<int:run_id>/", RunConsumer.as_asgi()),
]
