"""Celery tasks of the core app."""

from __future__ import annotations

import socket
from datetime import datetime

from celery import shared_task
from django.conf import settings

from core.models import WorkerPing


def broker_kind() -> str:
    return settings.CELERY_BROKER_URL.split("://", 1)[0] or "unknown"


@shared_task(name="core.worker_ping")
def worker_ping(token: str, sent_at_iso: str) -> None:
    """Record that a worker consumed this task. Idempotent on ``token`` (safe to redeliver)."""
    WorkerPing.objects.get_or_create(
        token=token,
        defaults={
            "hostname": socket.gethostname(),
            "broker": broker_kind(),
            "sent_at": datetime.fromisoformat(sent_at_iso),
        },
    )
