"""Reads of the core app."""

from __future__ import annotations

from datetime import timedelta

from django.db import DatabaseError, connection
from django.utils import timezone

from core.models import WorkerPing


def database_answers() -> bool:
    """A round trip to the database succeeds."""
    try:
        with connection.cursor() as cur:
            cur.execute("SELECT 1")
            return cur.fetchone() == (1,)
    except DatabaseError:
        return False


def health_summary(*, worker_window_s: int = 300) -> dict[str, object]:
    """What a status page or a load balancer wants to know about this deployment."""
    from django.conf import settings

    if not database_answers():
        return {"database": connection.vendor, "database_ok": False}
    since = timezone.now() - timedelta(seconds=worker_window_s)
    last = WorkerPing.objects.filter(answered_at__gte=since).first()
    return {
        "database": connection.vendor,
        "database_ok": True,
        "broker": settings.CELERY_BROKER_URL.split("://", 1)[0],
        "channel_layer": settings.CHANNEL_LAYERS["default"]["BACKEND"].rsplit(".", 1)[-1],
        "last_worker_ping": last.answered_at.isoformat() if last else None,
        "worker_hostname": last.hostname if last else None,
    }
