"""Browser tests: a real ASGI server (daphne, in a subprocess, on the session's test database) driven by
Debian's Chromium through Playwright. Skipped, with the reason, when /usr/bin/chromium is absent
(`bash scripts/system-deps.sh` installs it; never `playwright install`)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT, child_process_env

CHROMIUM = "/usr/bin/chromium"
PASSWORD = "pw-for-tests"  # the password tests.factories.UserFactory sets


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if Path(CHROMIUM).exists():
        return
    skip = pytest.mark.skip(
        reason=f"{CHROMIUM} is missing: run `bash scripts/system-deps.sh` to install Chromium"
    )
    for item in items:
        if "e2e" in item.keywords:
            item.add_marker(skip)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    def __init__(self, proc: subprocess.Popen[bytes], url: str, log_path: Path):
        self.proc, self.url, self.log_path = proc, url, log_path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


@pytest.fixture(scope="session")
def asgi_server(django_db_setup, django_db_blocker, tmp_path_factory) -> Iterator[LiveServer]:
    """daphne serving config.asgi (HTTP + websockets) on a free localhost port."""
    with django_db_blocker.unblock():
        env = child_process_env()
    # Launch/cancel/resume from the browser enqueue launcher tasks. They go to a queue of their own that no
    # worker consumes, so that the launcher tests' worker (if still up) never picks up a
    # browser test's run and launches a real Ray job for it. The queue is purged at the end.
    queue = f"e2e-{uuid.uuid4().hex[:8]}"
    env["CELERY_QUEUE"] = env["CELERY_LAUNCHER_QUEUE"] = queue
    port = free_port()
    log_path = tmp_path_factory.mktemp("daphne") / "daphne.log"
    cmd = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "config.asgi:application"]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            cmd, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    server = LiveServer(proc, f"http://127.0.0.1:{port}", log_path)
    deadline = time.monotonic() + 60
    while True:
        if proc.poll() is not None:
            pytest.fail(f"daphne exited with {proc.returncode}:\n{server.log()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{server.url}/accounts/login/", timeout=2) as resp:
                if resp.status == 200:
                    break
        except OSError:
            pass
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"daphne did not answer within 60 s:\n{server.log()[-3000:]}")
        time.sleep(0.2)
    try:
        yield server
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        purge_queue(queue)


def purge_queue(queue: str) -> None:
    """Drop the tasks the browser tests enqueued (best effort: a broker hiccup must not fail teardown)."""
    from config.celery import app

    try:
        with app.connection_for_write() as conn:
            conn.default_channel.queue_purge(queue)
    except Exception as exc:  # e.g. the queue was never declared because no task was sent
        print(f"note: could not purge {queue}: {exc}", file=sys.stderr)


@pytest.fixture(scope="module")
def browser(asgi_server):
    """Chromium for one test module.

    Playwright's sync API keeps an event loop running in this thread while it is open; the tests' own ORM
    calls (and the test database's flush) are plain blocking calls made between browser steps, which is
    safe, so Django's async-context guard is lifted for exactly as long as the browser lives. The server
    (and with it the test database) is set up before, so that setup runs outside the loop.
    """
    from playwright.sync_api import expect, sync_playwright

    # Live updates arrive within the consumer's poll interval (1.5 s); leave room for a loaded CI box.
    expect.set_options(timeout=15_000)

    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as pw:
            b = pw.chromium.launch(
                executable_path=CHROMIUM, headless=True, args=["--disable-gpu", "--disable-quic"]
            )
            try:
                yield b
            finally:
                b.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture
def page(browser, asgi_server):
    """A fresh browser context (no cookies) whose relative URLs go to the live server."""
    context = browser.new_context(base_url=asgi_server.url, viewport={"width": 1360, "height": 1000})
    context.set_default_timeout(15_000)
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    pg.js_errors = errors  # type: ignore[attr-defined]
    try:
        yield pg
    finally:
        context.close()


def login(page, username: str, password: str = PASSWORD) -> None:
    page.goto("/accounts/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("button[type=submit]")
    page.wait_for_url("**/")


def screenshot_dir(tmp_path: Path) -> Path:
    """Where screenshots go: $E2E_SCREENSHOT_DIR when set (to look at them), else the test's tmp dir."""
    target = Path(os.environ.get("E2E_SCREENSHOT_DIR") or tmp_path)
    target.mkdir(parents=True, exist_ok=True)
    return target
