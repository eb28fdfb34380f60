"""The reward contract: ``RewardFn(sample) -> float``, and ``SafeReward``, the wrapper every reward runs
in (a reward that raises, or returns NaN, scores 0 for that sample, is counted and logged, and never
stops the rollout)."""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable

from rl_engine.types import Sample

log = logging.getLogger(__name__)

RewardFn = Callable[[Sample], float]


class SafeReward:
    """A reward function that cannot crash its caller.

    An exception (or a non-finite value) scores ``error_value`` for that sample, marks it
    (``sample.extra["reward_error"] = 1``), counts it (``errors``, also in ``stats()``) and logs it:
    the first ``log_first`` errors in full, then every ``log_every``-th, so a reward that fails on every
    sample cannot flood the log.
    """

    def __init__(
        self, fn: RewardFn, name: str, *, error_value: float = 0.0, log_first: int = 5, log_every: int = 100
    ):
        self.fn, self.name, self.error_value = fn, name, error_value
        self.log_first, self.log_every = log_first, log_every
        self.calls = 0
        self.errors = 0
        self._lock = threading.Lock()  # rollouters may score from several threads

    def __call__(self, sample: Sample) -> float:
        with self._lock:
            self.calls += 1
        try:
            value = float(self.fn(sample))
            if not math.isfinite(value):
                raise ValueError(f"returned {value}")
            return value
        except Exception as exc:
            with self._lock:
                self.errors += 1
                n = self.errors
            if n <= self.log_first or n % self.log_every == 0:
                log.warning(
                    "reward %r failed on prompt %s (%d failures so far, scored %s): %s: %s",
                    self.name,
                    sample.prompt_uid,
                    n,
                    self.error_value,
                    type(exc).__name__,
                    exc,
                )
            sample.extra["reward_error"] = 1.0
            return self.error_value

    def stats(self) -> dict[str, float]:
        """Cumulative counts for the step metrics."""
        return {"reward/errors": float(self.errors), "reward/calls": float(self.calls)}


# The prefix of a component's score in ``Sample.extra`` (and of its metric, ``reward/<key>/mean``).
COMPONENT_PREFIX = "reward/"


class WeightedSum:
    """The reward of ``reward.combine``: ``sum(weight * score)`` of its components, each run in its own
    ``SafeReward`` (a component that fails scores 0 and marks the sample; the others still count).

    Each component's score is kept on the sample (``sample.extra["reward/<key>"]``): the trainer's step
    metrics average it (``reward/<key>/mean``) beside the total's ``reward/mean``."""

    def __init__(self, parts: list[tuple[str, float, SafeReward]]):
        if not parts:
            raise ValueError("a weighted sum needs at least one reward")
        self.parts = parts
        self.name = "+".join(key for key, _, _ in parts)
        self.calls = 0
        self._lock = threading.Lock()

    def __call__(self, sample: Sample) -> float:
        with self._lock:
            self.calls += 1
        total = 0.0
        for key, weight, fn in self.parts:
            score = fn(sample)
            sample.extra[f"{COMPONENT_PREFIX}{key}"] = score
            total += weight * score
        return total

    @property
    def errors(self) -> int:
        return sum(fn.errors for _, _, fn in self.parts)

    def stats(self) -> dict[str, float]:
        """``reward/errors``: failed component calls (all components); ``reward/calls``: samples scored."""
        return {"reward/errors": float(self.errors), "reward/calls": float(self.calls)}


def component_means(extras: list[dict[str, float]]) -> dict[str, float]:
    """``{"reward/<key>/mean": mean}`` over the samples' component scores (``WeightedSum``); a sample
    without a key (none, unless the batch mixes rewards) is left out of that key's mean."""
    sums: dict[str, list[float]] = {}
    for extra in extras:
        for key, value in extra.items():
            if key.startswith(COMPONENT_PREFIX):
                acc = sums.setdefault(key, [0.0, 0.0])
                acc[0] += float(value)
                acc[1] += 1.0
    return {f"{key}/mean": total / count for key, (total, count) in sorted(sums.items())}
