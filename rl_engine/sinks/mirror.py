"""Mirrors: copies of the run in another tracker (MLflow, W&B) that can never stop or slow training.

``MirrorSink`` wraps the tracker's sink: every call is queued and applied by one background thread, so
a slow or hung tracker server costs the training loop nothing; a call that raises (or a tracker that
cannot even be reached at start) is reported as an ``alert`` event through the run's other sinks —
the first failure of each kind, then every ``alert_every``-th — and training goes on without it.
A full queue drops the oldest calls (counted, alerted once) rather than growing without bound.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from rl_engine.sinks.base import MetricsSink
from rl_engine.wire import EventKind

log = logging.getLogger(__name__)

ReportFn = Callable[[EventKind, str, dict[str, Any] | None], None]


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (lists stay values): a config as tracker params."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


class MirrorSink(MetricsSink):
    """Runs ``factory()``'s sink on a background thread; see the module docstring."""

    def __init__(
        self,
        name: str,
        factory: Callable[[], MetricsSink],
        report: ReportFn,
        *,
        max_queue: int = 10_000,
        alert_every: int = 100,
        close_timeout_s: float = 60.0,
    ):
        self.name = name
        self._report = report
        self._queue: collections.deque[tuple[str, tuple[Any, ...]]] = collections.deque()
        self._max_queue = max_queue
        self._alert_every = alert_every
        self._close_timeout_s = close_timeout_s
        self._cond = threading.Condition()
        self._closing = False
        self.failures: collections.Counter[str] = collections.Counter()
        self.dropped = 0
        self.inner: MetricsSink | None = None
        self._thread = threading.Thread(target=self._run, args=(factory,), name=f"mirror-{name}", daemon=True)
        self._thread.start()

    # --- the interface: enqueue only -----------------------------------------------------------------
    def _put(self, method: str, *args: Any) -> None:
        with self._cond:
            if self._closing:
                return
            if len(self._queue) >= self._max_queue:
                self._queue.popleft()
                self.dropped += 1
                if self.dropped == 1:
                    self._alert("queue", f"queue full ({self._max_queue} calls): dropping the oldest")
            self._queue.append((method, args))
            self._cond.notify()

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        self._put("log_metrics", step, dict(metrics))

    def log_event(self, kind: EventKind, message: str, data: dict[str, Any] | None = None) -> None:
        self._put("log_event", kind, message, dict(data or {}))

    def log_samples(self, step: int, samples: list[dict[str, Any]]) -> None:
        self._put("log_samples", step, list(samples))

    def close(self) -> None:
        """Deliver what is queued (up to ``close_timeout_s``), then close the tracker's run."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join(self._close_timeout_s)
        if self._thread.is_alive():
            self._alert(
                "close",
                f"still busy after {self._close_timeout_s:.0f} s: {len(self._queue)} calls not delivered",
            )

    def pending(self) -> int:
        with self._cond:
            return len(self._queue)

    # --- the background thread ------------------------------------------------------------------------
    def _alert(self, what: str, detail: str) -> None:
        message = f"{self.name} mirror: {detail}; training continues without it"
        log.warning(message)
        try:  # the other sinks are thread-safe (they may be called from the pipeline's threads too)
            self._report(EventKind.ALERT, message, {"sink": self.name, "what": what})
        except Exception:
            log.exception("could not report a %s mirror failure", self.name)

    def _failed(self, what: str, exc: BaseException) -> None:
        self.failures[what] += 1
        n = self.failures[what]
        if n == 1 or n % self._alert_every == 0:
            self._alert(what, f"{what} failed ({n}x): {type(exc).__name__}: {str(exc)[:300]}")

    def _run(self, factory: Callable[[], MetricsSink]) -> None:
        try:
            self.inner = factory()
        except Exception as exc:
            self._failed("start", exc)
            with self._cond:  # nothing to deliver to: forget what is queued, accept nothing more
                self._closing = True
                self._queue.clear()
            return
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait()
                if not self._queue:
                    break
                method, args = self._queue.popleft()
            t0 = time.monotonic()
            try:
                getattr(self.inner, method)(*args)
            except Exception as exc:
                self._failed(method, exc)
            if time.monotonic() - t0 > 30:
                log.warning("%s mirror: one %s call took %.0f s", self.name, method, time.monotonic() - t0)
        try:
            self.inner.close()
        except Exception as exc:
            self._failed("close", exc)
