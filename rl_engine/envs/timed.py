"""An environment's step with a time limit (``env.step_timeout_s``): the step runs in a daemon thread and
the episode waits at most that long. A step that has not answered ends its episode unscored (left out of
the update, counted in ``env/timeouts``). Python cannot stop a thread, so the hung call is abandoned,
still running; after ``MAX_HANGS`` of them the environment is closed: every later episode ends at once,
unscored, so abandoned threads stay bounded and the rollout goes on (as a reward plugin's hang is
handled: ``rl_engine.rewards.base.SafeReward``)."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from rl_engine.envs.base import Environment, EnvStep, Episode

log = logging.getLogger(__name__)

MAX_HANGS = 4


class EnvTimeout(Exception):
    """A step that did not answer within the limit (or the environment was closed after hangs)."""


class EnvClosed(Exception):
    """The environment was closed after ``MAX_HANGS`` steps that did not answer: not called again."""


class TimedEnvironment:
    """Calls ``env.step`` with a per-step limit; ``seconds`` of the last call (module docstring)."""

    def __init__(self, env: Environment, timeout_s: float, max_hangs: int = MAX_HANGS):
        self.env, self.timeout_s, self.max_hangs = env, timeout_s, max_hangs
        self.hangs = 0
        self.closed = False
        self._lock = threading.Lock()

    def step(self, episode: Episode) -> tuple[EnvStep, float]:
        """(the step, its seconds); EnvTimeout when it did not answer in time, EnvClosed after too many
        of those; the step's own exception else."""
        if self.closed:
            raise EnvClosed(f"closed after {self.hangs} steps that did not answer within {self.timeout_s}s")
        box: dict[str, Any] = {}
        done = threading.Event()

        def call() -> None:
            try:
                box["step"] = self.env.step(episode)
            except BaseException as exc:  # handed to the caller
                box["error"] = exc
            finally:
                done.set()

        t0 = time.monotonic()
        threading.Thread(target=call, name="env-step", daemon=True).start()
        if not done.wait(self.timeout_s):
            with self._lock:
                self.hangs += 1
                if self.hangs >= self.max_hangs and not self.closed:
                    self.closed = True
                    log.error(
                        "environment closed: %d steps did not answer within %ss (their threads cannot be "
                        "stopped); every later episode ends unscored",
                        self.hangs,
                        self.timeout_s,
                    )
            raise EnvTimeout(f"no answer within {self.timeout_s}s")
        seconds = time.monotonic() - t0
        if "error" in box:
            error = box["error"]
            raise error if isinstance(error, Exception) else RuntimeError(f"raised {type(error).__name__}")
        return box["step"], seconds
