"""Checkpoint pauses of the rollouters: every rollouter a pause reached is unpaused on every path out.

A checkpoint pauses all rollouters (``Rollouter.pause`` holds the loop and returns its ``PauseState``),
writes the checkpoint and unpauses them. The wait for the pauses can end early: a stop request with a
rollouter that does not answer within the watchdog timeout (``StopWaitAbandoned``), or a rollouter
that fails (``PipelineError``). Then the rollouters whose pause already returned are unpaused at once
(a rollouter left paused would block the next checkpoint's pause, and every later control call,
forever), and a pause still running is remembered: when it returns, that rollouter is held with a
state that is still current (a held loop changes nothing), so the next checkpoint (the final one of a
stopping run) waits on that same call instead of sending a second pause that would queue behind it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import ray
from ray.exceptions import RayActorError, RayTaskError

from rl_engine.pipeline.watch import Waiter
from rl_engine.types import PauseState


class RolloutPauses:
    """``with pauses.held(stage) as states:`` all rollouters paused inside the block (see module doc)."""

    def __init__(self, rollouters: list[Any], waiter: Waiter) -> None:
        self.rollouters, self.waiter = rollouters, waiter
        self.outstanding: dict[int, Any] = {}  # rollouter index -> ObjectRef of a pause not yet seen back

    @contextlib.contextmanager
    def held(self, stage: str) -> Iterator[list[PauseState]]:
        refs = [self.outstanding.pop(i, None) or r.pause.remote() for i, r in enumerate(self.rollouters)]
        try:
            states: list[PauseState] = self.waiter.wait_all(refs, stage)
        except BaseException:
            self._release(refs, stage, raising=False)
            raise
        try:
            yield states
        except BaseException:
            self._release(refs, stage, raising=False)
            raise
        self._release(refs, stage, raising=True)

    def _release(self, refs: list[Any], stage: str, *, raising: bool) -> None:
        """Unpause every rollouter whose pause returned; remember the pauses still running. With
        ``raising`` False (an error is already on its way out) a failing unpause is not raised."""
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        done = set(ready)
        unpause = []
        for i, ref in enumerate(refs):
            if ref not in done:
                self.outstanding[i] = ref
                continue
            try:
                ray.get(ref, timeout=0)
            except (RayTaskError, RayActorError):
                continue  # the pause failed: that rollouter is not held
            unpause.append(self.rollouters[i].unpause.remote())
        if not unpause:
            return
        try:
            self.waiter.wait_all(unpause, f"{stage}: unpause")
        except Exception:  # StopWaitAbandoned, PipelineError
            if raising:
                raise


__all__ = ["RolloutPauses"]
