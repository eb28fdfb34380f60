"""A private ``redis-server`` on a free port, for tests that stop and restart Redis.

The machine's shared Redis (127.0.0.1:6379) is never stopped, restarted or flushed by a test; a test
that needs Redis to go away starts its own server here, on a port of its own, with no persistence.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def answers(port: int) -> bool:
    """A PING gets PONG (the server accepts commands, not only connections)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def require_redis_server() -> None:
    """Skip without a redis-server binary, except in the production pass (REDIS_URL set): CI has one."""
    if Path(REDIS_SERVER).exists():
        return
    message = f"{REDIS_SERVER} is missing (apt-get install redis-server)"
    if os.environ.get("REDIS_URL"):
        pytest.fail(message)
    pytest.skip(message)


@dataclass
class PrivateRedis:
    """One redis-server process on ``port``; ``stop()`` and ``start()`` again keep the port."""

    dir: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 15.0) -> None:
        cmd = [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
               "--appendonly", "no", "--dir", str(self.dir)]  # fmt: skip
        with open(self.dir / "redis.log", "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while not answers(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server on {self.port} did not start:\n{self.log()[-2000:]}")
            time.sleep(0.05)

    def stop(self) -> None:
        """SIGKILL: an outage, not a clean shutdown (clients see their connections reset)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        self.proc = None

    def log(self) -> str:
        path = self.dir / "redis.log"
        return path.read_text(errors="replace") if path.exists() else ""
