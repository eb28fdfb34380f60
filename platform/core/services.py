"""Writes of the core app."""

from __future__ import annotations

import secrets

from django.db import transaction
from django.utils import timezone


def worker_ping_send() -> str:
    """Enqueue a ping for any Celery worker (after commit); returns the token to look for."""
    from core.tasks import worker_ping

    token = secrets.token_hex(16)
    sent_at = timezone.now().isoformat()
    transaction.on_commit(lambda: worker_ping.delay(token, sent_at))
    return token
