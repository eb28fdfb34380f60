"""A real Celery worker executes a task through each broker and the result lands in the database."""

from __future__ import annotations

import subprocess
import sys

import pytest

from core.models import WorkerPing
from tests.conftest import REPO_ROOT, child_process_env, start_celery_worker


def ping_through(broker_env: dict[str, str], tmp_path) -> str:
    """Start a worker and run `manage.py ping_worker` with the same broker settings; return its output."""
    worker = start_celery_worker(tmp_path, pool="solo", concurrency=1, env_overrides=broker_env)
    try:
        env = child_process_env() | broker_env
        out = subprocess.run(
            [sys.executable, "manage.py", "ping_worker", "--wait", "30"],
            env=env,
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=90,
        )
        assert out.returncode == 0, out.stdout + out.stderr + worker.log()[-2000:]
        return out.stdout
    finally:
        worker.stop()


@pytest.mark.smoke
@pytest.mark.django_db(transaction=True)
def test_worker_executes_task_through_file_broker(tmp_path):
    env = {"VAR_DIR": str(tmp_path)}  # the embedded default: no REDIS_URL, broker files under VAR_DIR
    output = ping_through(env | {"REDIS_URL": ""}, tmp_path)
    assert "via filesystem" in output
    assert WorkerPing.objects.filter(broker="filesystem").count() == 1


@pytest.mark.django_db(transaction=True)
def test_worker_executes_task_through_redis_broker(tmp_path, redis_url):
    output = ping_through({"REDIS_URL": redis_url}, tmp_path)
    assert "via redis" in output
    assert WorkerPing.objects.filter(broker="redis").count() == 1


@pytest.mark.django_db(transaction=True)
def test_ping_without_worker_fails_with_one_line(tmp_path):
    env = child_process_env() | {"VAR_DIR": str(tmp_path), "REDIS_URL": ""}
    out = subprocess.run(
        [sys.executable, "manage.py", "ping_worker", "--wait", "1"],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 1
    assert "Traceback" not in out.stderr
    assert "no Celery worker answered within 1 s" in out.stderr
