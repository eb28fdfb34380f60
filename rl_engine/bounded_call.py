"""A call of the operator's code with a time limit: a reward plugin's (``rl_engine.rewards.base.SafeReward``)
or an environment's step (``rl_engine.envs.episodes``).

The call runs in a daemon thread and the caller waits at most ``timeout_s``. Python cannot stop a thread,
so a call that has not answered is abandoned, still running (a daemon thread: it does not keep the process
alive), and :class:`CallTimeout` is raised. After ``max_hangs`` of them the caller is **closed**: it is not
called again and every later call raises :class:`CallClosed` at once, so abandoned threads stay bounded and
the caller's own loop goes on.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

MAX_HANGS = 4


class CallTimeout(Exception):
    """A call that did not answer within its limit (its thread is left behind)."""


class CallClosed(Exception):
    """The caller was closed after ``max_hangs`` calls that did not answer: nothing is called any more."""


class BoundedCall:
    """Calls with a time limit (module docstring); ``hangs`` and ``closed`` say what happened so far.
    ``what`` names the code for the log ("reward 'units'", "environment 'calculator'")."""

    def __init__(self, timeout_s: float, what: str, max_hangs: int = MAX_HANGS):
        self.timeout_s, self.what, self.max_hangs = timeout_s, what, max_hangs
        self.hangs = 0
        self.closed = False
        self._lock = threading.Lock()

    def __call__(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)``'s result or exception; CallTimeout when it did not answer in time, CallClosed
        once closed."""
        if self.closed:
            raise CallClosed(f"closed after {self.hangs} calls that did not answer within {self.timeout_s}s")
        box: dict[str, Any] = {}
        done = threading.Event()

        def call() -> None:
            try:
                box["value"] = fn(*args)
            except BaseException as exc:  # handed to the caller
                box["error"] = exc
            finally:
                done.set()

        threading.Thread(target=call, name=f"bounded-{self.what}"[:64], daemon=True).start()
        if not done.wait(self.timeout_s):
            with self._lock:
                self.hangs += 1
                hung = self.hangs
                if hung >= self.max_hangs and not self.closed:
                    self.closed = True
                    log.error(
                        "%s closed: %d calls did not answer within %ss (their threads cannot be stopped); "
                        "it is not called again",
                        self.what,
                        hung,
                        self.timeout_s,
                    )
            raise CallTimeout(f"no answer within {self.timeout_s}s (call abandoned, {hung} so far)")
        if "error" in box:
            error = box["error"]
            raise error if isinstance(error, Exception) else RuntimeError(f"raised {type(error).__name__}")
        return box["value"]
