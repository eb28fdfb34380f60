"""Fixtures shared by the whole suite: environment for Ray, and real Celery workers on the test database.

A Celery worker is a separate process: it sees only committed rows, so tests that use one must use
``transactional_db`` (or ``live_server``). Each test session gets its own Celery queue, so two suites
running at once on one machine (or one broker) never steal each other's tasks.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SESSION_QUEUE = f"test-{os.getpid()}-{uuid.uuid4().hex[:6]}"
SESSION_DELIVERY_QUEUE = f"{SESSION_QUEUE}-deliveries"  # what settings derive from CELERY_QUEUE


def pytest_configure(config: pytest.Config) -> None:
    # Route every task this session enqueues to the session's own queue: settings read CELERY_QUEUE,
    # and Django settings are loaded lazily, after this hook.
    os.environ["CELERY_QUEUE"] = SESSION_QUEUE


@pytest.fixture(scope="session", autouse=True)
def flush_retries_a_deadlock():
    """A transactional test ends with TRUNCATE of every table while the session's background processes
    (Celery worker and beat, servers) may still be reading: PostgreSQL can see the TRUNCATE, which locks
    table after table, and one of their SELECTs, which locks several tables, each waiting for the other,
    and kills the TRUNCATE ("deadlock detected"; the test's teardown then errors). The flush runs in one
    transaction, rolled back by the deadlock: run it again, up to 5 times."""
    try:
        from django.db import OperationalError
        from django.db.backends.base.operations import BaseDatabaseOperations
    except ImportError:  # an environment without Django (the vLLM and floor checks' engine tests)
        yield
        return

    flush = BaseDatabaseOperations.execute_sql_flush

    def execute_sql_flush(self, sql_list):  # type: ignore[no-untyped-def]
        for attempt in range(5):
            try:
                return flush(self, sql_list)
            except OperationalError as exc:
                if "deadlock detected" not in str(exc) or attempt == 4:
                    raise
                time.sleep(0.2 * (attempt + 1))

    BaseDatabaseOperations.execute_sql_flush = execute_sql_flush  # type: ignore[method-assign]
    yield
    BaseDatabaseOperations.execute_sql_flush = flush  # type: ignore[method-assign]


@pytest.fixture(scope="session", autouse=True)
def no_local_ray_head_outlives_the_session():
    """A worker a test starts with the default settings launches runs on the platform's local Ray head
    in VAR_DIR/ray (``ray start --block``, detached): one the session started there is stopped when the
    session ends, so a test run never leaves a head behind (a CI run left one idle, holding 4 CPUs)."""
    try:
        from django.conf import settings

        from launcher import ray_local
    except ImportError:  # an environment without Django (the vLLM and floor checks' engine tests)
        yield
        return
    started, default_dir = time.time(), str(ray_local.ray_dir())
    yield
    changed = settings.RAY_LOCAL_DIR  # a stack fixture may have pointed it at its own folder
    settings.RAY_LOCAL_DIR = default_dir
    try:
        info = ray_local.read_state()
        if info is not None and info.started_at >= started:
            ray_local.stop()
    finally:
        settings.RAY_LOCAL_DIR = changed


def _answers(url: str, default_port: int) -> bool:
    parsed = urlparse(url)
    try:
        with socket.create_connection(
            (parsed.hostname or "127.0.0.1", parsed.port or default_port), timeout=3
        ):
            return True
    except OSError:
        return False


def pytest_sessionstart(session: pytest.Session) -> None:
    """A suite told to use PostgreSQL or Redis fails at once when they do not answer: it must never
    pass by skipping what it was asked to test."""
    down = [
        f"{name}={os.environ[name]} does not answer"
        for name, port in (("DATABASE_URL", 5432), ("REDIS_URL", 6379))
        if os.environ.get(name) and not _answers(os.environ[name], port)
    ]
    if down:
        pytest.exit("error: " + "; ".join(down) + " (start the server, or unset the variable)", returncode=1)


@pytest.fixture(scope="session")
def redis_url() -> str:
    """The Redis of the production pass (REDIS_URL). Skipped on the embedded default, where the suite
    runs without Redis; with REDIS_URL set it is reachable (checked at session start)."""
    url = os.environ.get("REDIS_URL", "")
    if not url:
        pytest.skip("needs Redis: runs in the production pass (REDIS_URL set)")
    return url


@pytest.fixture
def redis_bus(settings, tmp_path) -> Iterator[str]:
    """The live bus on Redis in both deployments: the production pass's Redis (REDIS_URL), else a
    private redis-server started for the test (harness/private_redis.py), so that what only the Redis bus
    does (another process's hub, a burst read in batches) is tested on the embedded default too.
    Channels under a prefix of the test's own. Returns the Redis URL."""
    from harness.private_redis import PrivateRedis, require_redis_server

    url, server = os.environ.get("REDIS_URL", ""), None
    if not url:
        require_redis_server()
        server = PrivateRedis(tmp_path)
        server.start()
        url = server.url
    settings.LIVE_BUS = {"url": url, "prefix": f"rlp-test-{uuid.uuid4().hex[:12]}"}
    yield url
    if server is not None:
        server.stop()


def child_process_env() -> dict[str, str]:
    """Environment that points a child process (worker, server) at the current test database."""
    from django.conf import settings
    from django.db import connection

    env = {k: v for k, v in os.environ.items() if k not in {"DJANGO_SETTINGS_MODULE"}}
    db = connection.settings_dict
    if connection.vendor == "sqlite":
        env["SQLITE_PATH"] = str(db["NAME"])
        env.pop("DATABASE_URL", None)
    else:
        auth = db["USER"] + (f":{db['PASSWORD']}" if db["PASSWORD"] else "")
        env["DATABASE_URL"] = (
            f"postgres://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
        )
    env["VAR_DIR"] = str(settings.VAR_DIR)
    env["CELERY_QUEUE"] = SESSION_QUEUE
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT / "platform"), str(REPO_ROOT)])
    return env


@dataclass
class CeleryWorker:
    """A real ``celery worker`` subprocess consuming this session's queues (its default one and the
    webhook deliveries') from the configured broker."""

    proc: subprocess.Popen[bytes]
    log_path: Path
    queue: str

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()


def start_celery_worker(
    tmp_dir: Path,
    *,
    pool: str = "threads",
    concurrency: int = 4,
    extra_args: list[str] | None = None,
    env_overrides: dict[str, str] | None = None,
    ready_timeout_s: float = 60.0,
) -> CeleryWorker:
    """Start a worker on the test database and wait until it reports ready."""
    env = child_process_env() | (env_overrides or {})
    log_path = tmp_dir / f"celery-{uuid.uuid4().hex[:6]}.log"
    cmd = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "config",
        "worker",
        "-l",
        "INFO",
        "-Q",
        f"{SESSION_QUEUE},{SESSION_DELIVERY_QUEUE}",
        f"--pool={pool}",
        f"--concurrency={concurrency}",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
        "-n",
        f"test-{uuid.uuid4().hex[:6]}@%h",
        *(extra_args or []),
    ]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            cmd, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    worker = CeleryWorker(proc=proc, log_path=log_path, queue=SESSION_QUEUE)
    deadline = time.monotonic() + ready_timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"celery worker exited with {proc.returncode}:\n{worker.log()[-3000:]}")
        if " ready." in worker.log():
            return worker
        time.sleep(0.2)
    worker.kill()
    raise RuntimeError(f"celery worker not ready after {ready_timeout_s}s:\n{worker.log()[-3000:]}")


def wait_for(predicate, *, timeout_s: float = 30.0, interval_s: float = 0.1, message: str = "condition"):
    """Poll ``predicate`` until it returns a truthy value; fail the test with ``message`` on timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    pytest.fail(f"timed out after {timeout_s}s waiting for {message}")
