"""``/api/health/``: a real Celery worker with embedded beat makes the worker's liveness and the sweep's
last run show up without anyone sending a ping; a broker that does not answer (a dead port) is a 503, as
a database that does not answer is."""

from __future__ import annotations

import socket
from datetime import datetime

import pytest
from django.db import DatabaseError
from django.utils import timezone
from rest_framework.test import APIClient

from core import selectors
from tests.conftest import start_celery_worker, wait_for


def health():
    return APIClient().get("/api/health/")


def dead_port() -> int:
    """A local port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.django_db
def test_a_fresh_deployment_answers_200_and_reports_no_worker_yet():
    resp = health()
    assert resp.status_code == 200
    body = resp.json()
    assert body["database_ok"] and body["broker_ok"]
    assert body["last_worker_ping"] is None and body["last_sweep"] is None


@pytest.mark.django_db
def test_a_broker_that_does_not_answer_is_a_503(settings):
    settings.CELERY_BROKER_URL = f"redis://127.0.0.1:{dead_port()}/0"
    settings.CELERY_BROKER_TRANSPORT = "launcher.broker:RedisTransport"
    resp = health()
    assert resp.status_code == 503
    assert resp.json()["broker_ok"] is False and resp.json()["database_ok"] is True


@pytest.mark.django_db
def test_a_database_that_does_not_answer_is_a_503(monkeypatch):
    def refuse(*args, **kwargs):
        raise DatabaseError("connection refused")

    monkeypatch.setattr(selectors.connection, "cursor", refuse)
    resp = health()
    assert resp.status_code == 503 and resp.json()["database_ok"] is False


@pytest.mark.slow
@pytest.mark.smoke  # the worker and beat on the file broker are the embedded deployment's own
@pytest.mark.django_db(transaction=True)
def test_a_running_worker_and_beat_show_up_without_a_ping(tmp_path):
    started = timezone.now()
    worker = start_celery_worker(
        tmp_path,
        extra_args=["-B", "-s", str(tmp_path / "beat-schedule")],
        env_overrides={"LAUNCHER_SWEEP_INTERVAL_S": "1"},
    )
    try:
        body = wait_for(
            lambda: (b := health().json())["last_sweep"] and b,
            timeout_s=60,
            message="the sweep run by the worker to show in /api/health/",
        )
        assert datetime.fromisoformat(body["last_sweep"]) >= started
        assert datetime.fromisoformat(body["last_worker_ping"]) >= started
        assert body["worker_hostname"] == socket.gethostname()
        first = body["last_sweep"]
        # It keeps moving while the worker and beat run: the record follows the sweep, not a request.
        wait_for(lambda: health().json()["last_sweep"] > first, timeout_s=30, message="a later sweep")
    finally:
        worker.stop()


@pytest.mark.timeout(30)
@pytest.mark.django_db
def test_a_redis_connected_but_silent_is_reported_down_within_the_checks_own_timeout(redis_url, settings):
    """A Redis that accepts connections and answers nothing (``CLIENT PAUSE ... ALL``) held the health
    check until it answered again (~9 s of a 10 s pause): its client had a connect timeout only. Now the
    check's own socket timeout ends the wait and the answer says the broker is down. The deployment's
    transport options carry no socket timeout here: the check must bring its own. The pause is short
    (Redis is shared) and lifted in a finally (an UNPAUSE waits for a pause of ALL to end: nothing
    outlives the test)."""
    import redis

    settings.CELERY_BROKER_URL = redis_url
    settings.CELERY_BROKER_TRANSPORT = "launcher.broker:RedisTransport"
    settings.CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": 3600}
    settings.HEALTH_CHECK_TIMEOUT_S = 0.5
    assert health().json()["broker_ok"] is True  # (answers while Redis does)
    pauser = redis.Redis.from_url(redis_url, socket_timeout=10)
    pauser.execute_command("CLIENT", "PAUSE", 2000, "ALL")
    try:
        resp = health()
    finally:
        pauser.execute_command("CLIENT", "UNPAUSE")
        pauser.close()
    assert resp.status_code == 503
    assert resp.json()["broker_ok"] is False and resp.json()["database_ok"] is True
