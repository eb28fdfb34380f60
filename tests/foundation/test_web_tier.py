"""The web tier's settings (platform/config/gunicorn.py): how many processes, and that every deployment
file starts the web server the same way."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from config.gunicorn import web_concurrency
from tests.conftest import REPO_ROOT

COMMAND = ["gunicorn", "-c", "python:config.gunicorn", "-b", "0.0.0.0:8000", "config.asgi:application"]


def test_web_concurrency_defaults_to_the_cpus_with_redis_and_to_one_process_without(monkeypatch):
    monkeypatch.delenv("WEB_CONCURRENCY", raising=False)
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:6379/0")
    assert web_concurrency() == len(os.sched_getaffinity(0))
    monkeypatch.setenv("WEB_CONCURRENCY", "5")
    assert web_concurrency() == 5
    monkeypatch.delenv("REDIS_URL")
    with pytest.raises(SystemExit, match="WEB_CONCURRENCY > 1 needs REDIS_URL"):
        web_concurrency()
    monkeypatch.delenv("WEB_CONCURRENCY")
    assert web_concurrency() == 1  # the embedded default: one process
    for bad in ("many", "0"):
        monkeypatch.setenv("WEB_CONCURRENCY", bad)
        with pytest.raises(SystemExit, match="WEB_CONCURRENCY"):
            web_concurrency()


def test_gunicorn_reads_the_settings_and_runs_that_many_uvicorn_workers():
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT / "platform"),
        "WEB_CONCURRENCY": "3",
        "REDIS_URL": "redis://x",
    }
    out = subprocess.run([sys.executable, "-m", "gunicorn", "--print-config", *COMMAND[1:]], env=env, cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=300, check=True).stdout  # fmt: skip
    config = {
        k.strip(): v.strip() for k, v in (line.split(" = ", 1) for line in out.splitlines() if " = " in line)
    }
    assert config["workers"] == "3"
    assert config["worker_class"] == "config.web_worker.Worker"
    assert config["bind"] == "['0.0.0.0:8000']"


def test_compose_and_the_image_start_the_web_tier_with_the_same_command():
    compose = yaml.safe_load((REPO_ROOT / "docker" / "compose.yaml").read_text())
    assert compose["services"]["web"]["command"] == COMMAND
    dockerfile = (REPO_ROOT / "docker" / "Dockerfile").read_text()
    cmd = next(line for line in dockerfile.splitlines() if line.startswith("CMD "))
    assert yaml.safe_load(cmd[4:]) == COMMAND
