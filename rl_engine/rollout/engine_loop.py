"""What the vLLM and SGLang workers share: a private event loop that owns the engine, and the
interrupt protocol built on it (see docs/engine.md, "GPU backends: the interrupt protocol").

Both engines are asyncio programs. SGLang's ``Engine`` runs its loop only inside its synchronous
methods (``run_until_complete``): a coroutine scheduled onto that loop from another thread while a
``generate`` is finishing is never run, and its caller waits forever. vLLM's ``AsyncLLM`` binds its
output handler to the loop it was built on. So each worker builds its engine *inside* a coroutine on
an :class:`EngineLoop` (a daemon thread in ``run_forever``) and only ever submits coroutines to it.

The protocol (:class:`InterruptGate`):

* ``interrupt()`` never blocks: it sets the flag, then *submits* the engine's abort coroutine and
  returns. Any caller (a rollouter holding its own lock, a timer) can call it.
* every request coroutine checks the flag on the loop thread immediately before it enters the
  engine; the flag is set before the abort is submitted, so a request either entered the engine
  before the abort (and is aborted with its partial output) or sees the flag and returns an empty
  ``abort`` without touching the engine. A request the engine refuses because it is paused
  (vLLM's ``RetryableRequestError``) is an ``abort`` too.
* ``clear_interrupt()`` waits (bounded) for the abort to complete, resumes the engine, then clears
  the flag.
* every wait is bounded: a timeout raises :class:`EngineTimeout` naming what did not finish.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class EngineError(RuntimeError):
    """A rollout engine call failed (the message names the engine call and its answer)."""


class EngineTimeout(EngineError):
    """A rollout engine call did not finish within its bound."""


class EngineLoop:
    """A private asyncio loop on a daemon thread (``run_forever``) that owns one engine."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=f"{name}-loop", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule ``coro`` on the loop; never blocks."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def wait(self, fut: concurrent.futures.Future[T], *, timeout: float, what: str) -> T:
        """The result of ``fut``, or :class:`EngineTimeout` after ``timeout`` seconds."""
        if threading.current_thread() is self._thread:
            raise RuntimeError(f"{self.name}: {what} waited on from the engine's own loop thread")
        try:
            return fut.result(timeout)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise EngineTimeout(
                f"{self.name}: {what} did not finish within {timeout:g} s (engine unresponsive?)"
            ) from None
        except EngineError:
            raise
        except Exception as exc:  # one line naming the engine call; the cause stays chained
            raise EngineError(f"{self.name}: {what} failed: {type(exc).__name__}: {exc}") from exc

    def call(self, coro: Coroutine[Any, Any, T], *, timeout: float, what: str) -> T:
        """Run ``coro`` on the loop and wait for it, bounded by ``timeout`` seconds."""
        return self.wait(self.submit(coro), timeout=timeout, what=what)

    def close(self, timeout: float = 10.0) -> None:
        """Cancel what still runs on the loop (bounded), then stop it."""
        if self.loop.is_closed():
            return

        async def cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        with contextlib.suppress(EngineError):
            self.call(cancel_all(), timeout=timeout, what="cancelling pending calls at close")
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout)
        if not self._thread.is_alive():
            self.loop.close()


class InterruptGate:
    """The interrupt protocol of an engine worker (see the module docstring).

    ``pause`` and ``resume`` are coroutine factories calling the engine's supported abort/resume API.
    """

    def __init__(
        self,
        loop: EngineLoop,
        pause: Callable[[], Coroutine[Any, Any, Any]],
        resume: Callable[[], Coroutine[Any, Any, Any]],
        flag: threading.Event,
        timeout_s: float,
    ) -> None:
        self._loop, self._pause, self._resume, self._flag = loop, pause, resume, flag
        self.timeout_s = timeout_s
        self._lock = threading.Lock()  # guards _pending only; never held across a wait
        self._pending: concurrent.futures.Future[Any] | None = None

    @property
    def paused(self) -> bool:
        """An abort was submitted and the engine has not been resumed since."""
        return self._pending is not None

    def interrupt(self) -> None:
        """Set the flag, submit the engine abort (once), return at once."""
        self._flag.set()
        with self._lock:
            if self._pending is None:
                self._pending = self._loop.submit(self._pause())

    def wait_paused(self) -> None:
        """Wait (bounded) until a submitted abort has completed; the engine stays paused."""
        pending = self._pending
        if pending is not None:
            self._loop.wait(pending, timeout=self.timeout_s, what="abort of in-flight requests")

    def clear(self) -> None:
        """Wait for the abort to complete, resume the engine, then clear the flag (all bounded)."""
        with self._lock:
            pending, self._pending = self._pending, None
        if pending is not None:
            self._loop.wait(pending, timeout=self.timeout_s, what="abort of in-flight requests")
            self._loop.call(self._resume(), timeout=self.timeout_s, what="resume after an abort")
        with self._lock:
            if self._pending is None:  # no new interrupt() arrived meanwhile
                self._flag.clear()
