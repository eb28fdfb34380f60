"""The reference remote reward service (``python -m rl_engine.reward_service``) as a real process on a
free port, for tests and benchmarks: started, waited for (``GET /health``), killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from harness.private_redis import free_port

REPO_ROOT = Path(__file__).resolve().parents[1]


@dataclass
class RewardServiceProcess:
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, grader: str) -> str:
        return f"{self.base_url}/score/{grader}"

    def start(self, timeout_s: float = 60.0) -> RewardServiceProcess:
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rl_engine.reward_service", "--port", str(self.port)],
            env=env,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the reward service exited with {self.proc.returncode}")
            try:
                if httpx.get(f"{self.base_url}/health", timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.kill()
        raise RuntimeError(f"the reward service did not answer within {timeout_s}s")

    def kill(self) -> None:
        """SIGKILL: the service vanishes mid-conversation, as a crashed grader does."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
