"""The leader's side of a trainer group: every collective call run on all ranks at once.

Rank 0 of the group (``trainer_group.py``) holds ``Followers``, the handles of ranks 1..world-1, and
runs each collective call (train step, weight gather, checkpoint) on them while it runs its own part:
they meet in the collectives. A follower that dies or fails makes the leader's call fail with an error
naming that rank; ``RankStatus`` is what each rank reports to the watchdog.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

T = TypeVar("T")


class TrainerRankError(RuntimeError):
    """A rank of the trainer group died or failed; the message names it."""


@dataclass(frozen=True)
class RankStatus:
    """What one rank is doing, for the watchdog: the operation and for how long (``None``: idle)."""

    rank: int
    op: str | None
    running_s: float


def _why(exc: BaseException) -> str:
    if isinstance(exc, RayActorError):
        return "died (its process exited)"
    cause = exc
    while isinstance(cause, RayTaskError) and getattr(cause, "cause", None) is not None:
        cause = cause.cause
    lines = str(cause).strip().splitlines()
    return f"failed: {type(cause).__name__}: {lines[0] if lines else ''}"


@dataclass
class Followers:
    """The leader's handles on ranks 1..world-1."""

    handles: list[Any] = field(default_factory=list)
    timeout_s: float = 600.0

    def run(self, method: str, args: tuple, own: Callable[[], T]) -> T:
        """Call ``method(*args)`` on every follower and ``own()`` here, at the same time (they meet in
        collectives). A follower's death or failure is raised naming its rank, also when it shows up here
        as a failed collective first."""
        refs = [getattr(h, method).remote(*args) for h in self.handles]
        try:
            result = own()
        except BaseException as exc:
            dead = self._first_failure(refs, wait_s=5.0)
            if dead:
                raise TrainerRankError(dead) from exc
            raise
        failure = self._first_failure(refs, wait_s=self.timeout_s, all_done=True)
        if failure:
            raise TrainerRankError(failure)
        return result

    def _first_failure(self, refs: list[Any], *, wait_s: float, all_done: bool = False) -> str | None:
        if not refs:
            return None
        ready, pending = ray.wait(refs, num_returns=len(refs), timeout=wait_s)
        for rank, ref in enumerate(refs, start=1):
            if ref in ready:
                try:
                    ray.get(ref)
                except (RayActorError, RayTaskError) as exc:
                    return f"trainer rank {rank} {_why(exc)}"
        if pending and all_done:
            ranks = [i for i, r in enumerate(refs, start=1) if r in pending]
            return f"trainer ranks {ranks} did not finish within {wait_s:.0f} s of rank 0"
        return None

    def statuses(self, timeout_s: float = 2.0) -> list[RankStatus | str]:
        """Each follower's ``RankStatus``, or why it did not answer."""
        out: list[RankStatus | str] = []
        for rank, h in enumerate(self.handles, start=1):
            try:
                out.append(ray.get(h.rank_status.remote(), timeout=timeout_s))
            except GetTimeoutError:
                out.append(f"trainer rank {rank} did not answer")
            except (RayActorError, RayTaskError) as exc:
                out.append(f"trainer rank {rank} {_why(exc)}")
        return out
