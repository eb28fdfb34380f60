"""Waiting on actors without ever hanging: stop requests, failures and the progress watchdog.

Every wait of the driver goes through ``Waiter``: it polls the awaited refs in short slices and,
between slices, (1) turns a stop request into ``TrainerActor.cancel`` (or, while awaiting an
evaluation, ``Rollouter.cancel_evaluation``), (2) pings rollouters — a
rollouter whose loop died re-raises its error from ``health`` and the run fails with it within about
a second, and (3) raises a sink ``alert`` event once per episode when a stage makes no progress for
``pipeline.watchdog_timeout_s``: a weight sync still running, a rollout call still running, a trainer
step (waiting or training) still running, or a rollouter not answering. A stalled stage's alert says what
every trainer rank is doing and for how long (``TrainerActor.group_status``): the rank stuck in a
collective and the operation; the collective's own timeout (``trainer.collective_timeout_s``) then
fails the step and the run.
"""

from __future__ import annotations

import re
import time
from typing import Any

import ray
from ray.exceptions import RayActorError, RayTaskError

from rl_engine.types import RolloutHealth
from rl_engine.wire import EventKind

_SLICE_S = 0.2
_HEALTH_EVERY_S = 0.5


class PipelineError(RuntimeError):
    """A pipeline actor failed; the message is one line: which actor, which error."""


class StopWaitAbandoned(RuntimeError):
    """A stop was requested and the awaited stage did not finish within the watchdog timeout."""


def root_cause(exc: BaseException) -> str:
    """One line for an error that may be wrapped by Ray several times (actor → actor → driver)."""
    if isinstance(exc, RayActorError):
        # an actor that died in its constructor carries the traceback only as text: keep its last error line
        lines = [ln.strip() for ln in str(getattr(exc, "error_msg", "") or exc).splitlines()]
        errs = [ln for ln in lines if re.match(r"^[A-Za-z_.]*(Error|Exception)\b.*: ", ln)]
        if errs:
            return f"actor died: {errs[-1]}"
        return f"actor died: {lines[0] if lines else type(exc).__name__}"
    seen = 0
    while isinstance(exc, RayTaskError) and getattr(exc, "cause", None) is not None and seen < 10:
        exc, seen = exc.cause, seen + 1
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    if type(exc).__name__ == "PipelineFailure":
        return first
    return f"{type(exc).__name__}: {first}"


class Waiter:
    """Polls refs for the driver ``run`` (which has ``stop``, ``sink``, ``cfg``, ``trainer``, ``rollouters``)."""

    def __init__(self, run: Any) -> None:
        self.run = run
        self.timeout = run.cfg.pipeline.watchdog_timeout_s
        self._alerted: set[str] = set()
        self._health_refs: list[Any] | None = None
        self._health_sent = 0.0
        self._cancel_sent = False

    def wait_one(self, ref: Any, stage: str, check_health: bool = True) -> Any:
        return self.wait_all([ref], stage, check_health)[0]

    def wait_all(self, refs: list[Any], stage: str, check_health: bool = True) -> list[Any]:
        t0 = time.monotonic()
        self._cancel_sent = False
        stop_seen: float | None = None
        pending = list(refs)
        while pending:
            _, pending = ray.wait(pending, num_returns=len(pending), timeout=_SLICE_S)
            for ref in refs:  # surface a failure as soon as any awaited ref fails
                if ref not in pending:
                    self.get(ref, stage)
            if pending:
                self._between(stage, time.monotonic() - t0, check_health)
                if self.run.stop.is_set() and stage != "train":
                    # a stuck stage (e.g. a sync waiting on a hung rollout) must not block a stop forever
                    stop_seen = stop_seen or time.monotonic()
                    if time.monotonic() - stop_seen > self.timeout:
                        raise StopWaitAbandoned(
                            f"{stage} did not finish within {self.timeout:.1f} s of the stop request"
                        )
        self._alerted.discard(stage)
        return [self.get(r, stage) for r in refs]

    def get(self, ref: Any, stage: str) -> Any:
        try:
            return ray.get(ref, timeout=30)
        except (RayTaskError, RayActorError) as exc:
            raise PipelineError(f"{stage} failed: {root_cause(exc)}") from None

    def _between(self, stage: str, elapsed: float, check_health: bool) -> None:
        run = self.run
        if run.stop.is_set() and stage == "train" and not self._cancel_sent:
            run.trainer.cancel.remote()
            self._cancel_sent = True
        if run.stop.is_set() and stage == "evaluation" and not self._cancel_sent:
            run.rollouters[0].cancel_evaluation.remote()  # it ends at its next chunk boundary
            self._cancel_sent = True
        if check_health:
            self._check_rollouters()
        if elapsed > self.timeout and stage != "build" and stage not in self._alerted:  # start-up: no stall
            what = "a trainer step (waiting for samples or training)" if stage == "train" else stage
            self._alert(
                stage, f"watchdog: {what} made no progress for {elapsed:.1f} s{self._trainer_ranks()}"
            )

    def _trainer_ranks(self) -> str:
        """What each trainer rank is doing (the leader answers on its second thread), for an alert."""
        try:
            statuses = ray.get(self.run.trainer.group_status.remote(), timeout=5.0)
        except Exception as exc:  # the leader itself is stuck or gone: say so
            return f"; trainer rank 0 did not report its state ({type(exc).__name__})"
        parts = [
            s
            if isinstance(s, str)
            else f"rank {s.rank}: {s.op or 'idle'}" + (f" for {s.running_s:.1f} s" if s.op else "")
            for s in statuses
        ]
        return "; trainer " + ", ".join(parts)

    def _check_rollouters(self) -> None:
        now = time.monotonic()
        if self._health_refs is None:
            if now - self._health_sent >= _HEALTH_EVERY_S:
                self._health_refs = [r.health.remote() for r in self.run.rollouters]
                self._health_sent = now
            return
        ready, _ = ray.wait(self._health_refs, num_returns=len(self._health_refs), timeout=0)
        if len(ready) < len(self._health_refs):
            if now - self._health_sent > self.timeout:
                self._alert(
                    "rollouter health",
                    f"watchdog: a rollouter has not answered for {now - self._health_sent:.1f} s",
                )
            return
        for i, ref in enumerate(self._health_refs):
            try:
                h: RolloutHealth = ray.get(ref)
            except (RayTaskError, RayActorError) as exc:
                raise PipelineError(f"rollouter {i} failed: {root_cause(exc)}") from None
            key = f"rollout {i}"
            if h.call_running_s > self.timeout:
                self._alert(
                    key,
                    f"watchdog: rollout call on rollouter {i} made no progress for {h.call_running_s:.1f} s",
                )
            else:
                self._alerted.discard(key)
        self._health_refs = None

    def _alert(self, key: str, message: str) -> None:
        if key in self._alerted:
            return
        self._alerted.add(key)
        self.run.sink.log_event(EventKind.ALERT, message, {"stage": key, "timeout_s": self.timeout})
