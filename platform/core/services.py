"""Writes of the core app."""

from __future__ import annotations

import secrets
import socket

from django.db import transaction
from django.utils import timezone


def worker_ping_send() -> str:
    """Enqueue a ping for any Celery worker (after commit); returns the token to look for."""
    from core.tasks import worker_ping

    token = secrets.token_hex(16)
    sent_at = timezone.now().isoformat()
    transaction.on_commit(lambda: worker_ping.delay(token, sent_at))
    return token


SWEEP_TOKEN_PREFIX = "sweep@"  # one WorkerPing row per worker host, updated by each sweep it runs


def sweep_ran() -> None:
    """Record that this worker just ran the periodic sweep (beat sent it through the broker): one row
    per host, updated in place."""
    from core.models import WorkerPing
    from core.tasks import broker_kind

    now = timezone.now()
    host = socket.gethostname()
    WorkerPing.objects.update_or_create(
        token=f"{SWEEP_TOKEN_PREFIX}{host}"[:64],
        defaults={"hostname": host, "broker": broker_kind(), "sent_at": now, "answered_at": now},
    )
