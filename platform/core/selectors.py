"""Reads of the core app."""

from __future__ import annotations

from datetime import timedelta

from django.db import DatabaseError, connection
from django.utils import timezone

from core.models import WorkerPing
from core.services import SWEEP_TOKEN_PREFIX


def database_answers() -> bool:
    """A round trip to the database succeeds."""
    try:
        with connection.cursor() as cur:
            cur.execute("SELECT 1")
            return cur.fetchone() == (1,)
    except DatabaseError:
        return False


HEALTH_CHECK_TIMEOUT_S = 2.0  # default of settings.HEALTH_CHECK_TIMEOUT_S


def broker_answers(timeout_s: float | None = None) -> bool:
    """A connection to the Celery broker this deployment is configured with succeeds, within
    ``timeout_s`` (default: ``settings.HEALTH_CHECK_TIMEOUT_S``). For Redis the check's client also has a
    socket timeout of its own: a Redis that accepts connections but answers nothing (``CLIENT PAUSE``, a
    hung proxy) held the health check until it answered again (~9 s)."""
    from django.conf import settings
    from kombu import Connection

    if timeout_s is None:
        timeout_s = float(getattr(settings, "HEALTH_CHECK_TIMEOUT_S", HEALTH_CHECK_TIMEOUT_S))
    options = dict(getattr(settings, "CELERY_BROKER_TRANSPORT_OPTIONS", {}))
    if settings.CELERY_BROKER_URL.split("://", 1)[0] in ("redis", "rediss"):
        options.update(socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
    conn = Connection(
        settings.CELERY_BROKER_URL,
        transport=getattr(settings, "CELERY_BROKER_TRANSPORT", None),
        transport_options=options,
        connect_timeout=timeout_s,
    )
    try:
        conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0, timeout=timeout_s)
        return True
    except Exception:  # kombu raises the transport's own errors (OSError, redis, ...)
        return False
    finally:
        conn.release()


def health_summary(*, worker_window_s: int = 300) -> dict[str, object]:
    """What a status page or a load balancer wants to know about this deployment. ``ok`` is False when
    the database or the broker does not answer (the endpoint then answers 503). A worker's liveness is
    reported, not required: ``last_worker_ping`` is its latest answer within ``worker_window_s`` (a
    ping, or a periodic sweep it ran), ``last_sweep`` the latest sweep any worker ran."""
    from django.conf import settings

    broker = settings.CELERY_BROKER_URL.split("://", 1)[0]
    broker_ok = broker_answers()
    if not database_answers():
        return {"database": connection.vendor, "database_ok": False, "broker": broker, "broker_ok": broker_ok}
    since = timezone.now() - timedelta(seconds=worker_window_s)
    last = WorkerPing.objects.filter(answered_at__gte=since).first()
    sweep = WorkerPing.objects.filter(token__startswith=SWEEP_TOKEN_PREFIX).first()
    return {
        "database": connection.vendor,
        "database_ok": True,
        "broker": broker,
        "broker_ok": broker_ok,
        "live_bus": "redis" if getattr(settings, "LIVE_BUS", None) else "memory",
        "last_worker_ping": last.answered_at.isoformat() if last else None,
        "worker_hostname": last.hostname if last else None,
        "last_sweep": sweep.answered_at.isoformat() if sweep else None,
    }
