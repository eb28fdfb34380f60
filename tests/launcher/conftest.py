"""Launcher fixtures: one real Ray head, one real web server and one real Celery worker (with the
embedded beat running the sweep) for the launcher package, torn down when it ends, on the session's
test database.

The web server is a subprocess (daphne) rather than pytest-django's in-process ``live_server``
because one test restarts it mid-run; it listens on a fixed port so the engine's HTTP sink, configured
at job submission, reaches whichever incarnation is up.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.error import URLError
from urllib.request import urlopen

import pytest

from tests.conftest import (
    REPO_ROOT,
    SESSION_DELIVERY_QUEUE,
    SESSION_QUEUE,
    CeleryWorker,
    child_process_env,
    start_celery_worker,
)

# Short enough to keep each test at seconds, long enough for a loaded 2-core machine.
LEASE_S = 8
SWEEP_S = 1
HEARTBEAT_TIMEOUT_S = 60
# Launcher tasks go to a queue only our worker consumes (a worker on the session's default queue
# must not pick them up with settings that point at another head and web server).
LAUNCHER_QUEUE = f"{SESSION_QUEUE}-launcher"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class WebServer:
    """A real ASGI server (daphne) on a fixed port, restartable."""

    port: int
    log_path: Path
    env: dict[str, str]
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 60.0) -> None:
        cmd = [
            sys.executable,
            "-m",
            "daphne",
            "-b",
            "127.0.0.1",
            "-p",
            str(self.port),
            "config.asgi:application",
        ]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)  # fmt: skip
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"web server exited:\n{self.log_path.read_text()[-3000:]}")
            try:
                with urlopen(f"{self.url}/api/schema/", timeout=2):
                    return
            except URLError as exc:
                if getattr(exc, "code", None):  # any HTTP answer means it is serving
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"web server not up after {timeout_s}s:\n{self.log_path.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=20)


@dataclass
class LauncherStack:
    web: WebServer
    worker: CeleryWorker
    env: dict[str, str]
    tmp: Path
    restart_worker: Callable[[], CeleryWorker]


def _worker_args(tmp: Path) -> list[str]:
    # A later -Q replaces the default one: this worker consumes the launcher queue and the webhook
    # deliveries' (a run that fails opens an alert, whose deliveries the worker's settings route there).
    queues = f"{LAUNCHER_QUEUE},{SESSION_DELIVERY_QUEUE}"
    return ["-Q", queues, "-B", "-s", str(tmp / f"beat-{uuid.uuid4().hex[:6]}")]


@pytest.fixture(scope="package")
def launcher_stack(django_db_setup, django_db_blocker, tmp_path_factory) -> Iterator[LauncherStack]:
    from django.conf import settings

    from launcher import ray_local

    tmp = tmp_path_factory.mktemp("launcher")
    port = free_port()
    overrides = {
        "RAY_LOCAL_DIR": str(tmp / "ray"),  # this session's own head, never the demo's
        "RAY_LOCAL_NUM_CPUS": "4",
        "PLATFORM_URL": f"http://127.0.0.1:{port}",
        "RUN_CONCURRENCY_LIMIT": "8",
        "RUN_CONCURRENCY_LIMIT_PER_PROJECT": "1",
        "RUN_HEARTBEAT_TIMEOUT_S": str(HEARTBEAT_TIMEOUT_S),
        "LAUNCHER_LEASE_S": str(LEASE_S),
        "LAUNCHER_SWEEP_INTERVAL_S": str(SWEEP_S),
        "RUN_CANCEL_GRACE_S": "4",
        "CELERY_LAUNCHER_QUEUE": LAUNCHER_QUEUE,
    }
    # The head is started here, with the stack's settings, so that its address is known up front: the
    # worker also gets it as RAY_ADDRESS, the "existing cluster" of runs with provider "address".
    settings.RAY_LOCAL_DIR = overrides["RAY_LOCAL_DIR"]
    settings.RAY_LOCAL_NUM_CPUS = int(overrides["RAY_LOCAL_NUM_CPUS"])
    settings.RUN_CANCEL_GRACE_S = int(overrides["RUN_CANCEL_GRACE_S"])
    overrides["RAY_ADDRESS"] = ray_local.ensure_started().dashboard_url
    from config.celery import app

    # Package scope: the stack's worker runs beat, whose sweep admits every queued run in the database,
    # so it must be gone before later packages (frontend, e2e) create queued runs of their own.
    previous_routes = app.conf.task_routes
    app.conf.task_routes = {"launcher.*": {"queue": LAUNCHER_QUEUE}}  # what run_create enqueues here
    with django_db_blocker.unblock():
        env = child_process_env() | overrides
        web = WebServer(port=port, log_path=tmp / "web.log", env=env)
        web.start()
        holder: dict[str, CeleryWorker] = {}

        def restart_worker() -> CeleryWorker:
            holder["w"] = start_celery_worker(
                tmp, concurrency=8, extra_args=_worker_args(tmp), env_overrides=overrides
            )
            return holder["w"]

        restart_worker()
    try:
        yield LauncherStack(web=web, worker=holder["w"], env=env, tmp=tmp, restart_worker=restart_worker)
    finally:
        holder["w"].stop()
        web.stop()
        ray_local.stop()
        app.conf.task_routes = previous_routes
