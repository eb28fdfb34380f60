"""The reward contract: ``RewardFn(sample) -> float``, and ``SafeReward``, the wrapper every reward runs
in (a reward that raises, returns NaN, or (a plugin) hangs past its timeout scores 0 for that sample, is
counted and logged, and never stops the rollout)."""

from __future__ import annotations

import logging
import math
import re
import threading
from collections.abc import Callable, Mapping
from typing import Any

from rl_engine.types import Sample

log = logging.getLogger(__name__)

RewardFn = Callable[[Sample], float]


# A plugin's per-call limit when the config sets none (``reward.timeout_s``), and how many calls may be
# left hanging before the reward is closed: a thread that never returns cannot be killed in Python.
DEFAULT_TIMEOUT_S = 10.0
MAX_HANGS = 4
# A figure's name in a reward's mapping result, as a component's label (metric reward/<name>/<figure>/mean).
FIGURE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
MAX_FIGURES = 32


class RewardTimeout(Exception):
    """A reward call that did not answer within its ``timeout_s`` (its thread is left behind)."""


class SafeReward:
    """A reward function that cannot crash (or, with ``timeout_s``, stall) its caller.

    An exception (or a non-finite value, or a malformed mapping) scores ``error_value`` for that sample,
    marks it (``sample.extra["reward_error"] = 1``), counts it (``errors``, also in ``stats()``) and logs
    it: the first ``log_first`` errors in full, then every ``log_every``-th, so a reward that fails on
    every sample cannot flood the log.

    The function may return a mapping instead of a float: ``score`` is the score, every other key a
    figure (a finite float) kept on the sample as ``sample.extra["reward/<name>/<figure>"]`` (the step
    metric ``reward/<name>/<figure>/mean``).

    With ``timeout_s`` (reward plugins: the operator's code) each call runs in a daemon thread and the
    caller waits at most that long: a call that has not answered scores as an error (``timeouts``). Python
    cannot kill a thread, so the hung call is abandoned, still running; after ``max_hangs`` of them the
    reward is closed: it is not called again and every later sample scores as an error, so hung threads
    stay bounded and the rollouter goes on (at ``error_value``, loudly logged).
    """

    def __init__(
        self,
        fn: Callable[[Sample], Any],
        name: str,
        *,
        error_value: float = 0.0,
        log_first: int = 5,
        log_every: int = 100,
        timeout_s: float | None = None,
        max_hangs: int = MAX_HANGS,
    ):
        self.fn, self.name, self.error_value = fn, name, error_value
        self.log_first, self.log_every = log_first, log_every
        self.timeout_s, self.max_hangs = timeout_s, max_hangs
        self.calls = 0
        self.errors = 0
        self.timeouts = 0
        self.closed = False
        self._lock = threading.Lock()  # rollouters may score from several threads

    def __call__(self, sample: Sample) -> float:
        with self._lock:
            self.calls += 1
        try:
            if self.closed:
                raise RewardTimeout(
                    f"closed after {self.timeouts} calls that did not answer within {self.timeout_s}s"
                )
            result = self.fn(sample) if self.timeout_s is None else self._call_in_thread(sample)
            value, figures = self._value(result)
            for figure, number in figures.items():
                sample.extra[f"{COMPONENT_PREFIX}{self.name}/{figure}"] = number
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

    @staticmethod
    def _value(result: Any) -> tuple[float, dict[str, float]]:
        """(score, figures) of a result: a number, or a mapping with ``score`` and named figures."""
        figures: dict[str, float] = {}
        if isinstance(result, Mapping):
            if "score" not in result:
                raise ValueError(
                    f"returned a mapping without 'score' (keys: {', '.join(map(str, result))[:200]})"
                )
            if len(result) - 1 > MAX_FIGURES:
                raise ValueError(f"returned {len(result) - 1} figures (at most {MAX_FIGURES})")
            for key, raw in result.items():
                if key == "score":
                    continue
                if not isinstance(key, str) or not FIGURE_NAME.match(key):
                    raise ValueError(f"figure name {str(key)[:80]!r}: letters, digits, _ . - (at most 64)")
                number = float(raw)
                if not math.isfinite(number):
                    raise ValueError(f"figure {key!r} is {number}")
                figures[key] = number
            result = result["score"]
        value = float(result)
        if not math.isfinite(value):
            raise ValueError(f"returned {value}")
        return value, figures

    def _call_in_thread(self, sample: Sample) -> Any:
        box: dict[str, Any] = {}
        done = threading.Event()

        def call() -> None:
            try:
                box["value"] = self.fn(sample)
            except BaseException as exc:  # handed to the caller, which counts it
                box["error"] = exc
            finally:
                done.set()

        threading.Thread(target=call, name=f"reward-{self.name}", daemon=True).start()
        if not done.wait(self.timeout_s):
            with self._lock:
                self.timeouts += 1
                hung = self.timeouts
                if hung >= self.max_hangs and not self.closed:
                    self.closed = True
                    log.error(
                        "reward %r closed: %d calls did not answer within %ss (their threads cannot be "
                        "stopped); every later sample scores %s as an error",
                        self.name,
                        hung,
                        self.timeout_s,
                        self.error_value,
                    )
            raise RewardTimeout(f"no answer within {self.timeout_s}s (call abandoned, {hung} so far)")
        if "error" in box:
            error = box["error"]
            if isinstance(error, Exception):
                raise error
            raise RuntimeError(f"raised {type(error).__name__}")
        return box["value"]

    def stats(self) -> dict[str, float]:
        """Cumulative counts for the step metrics (``reward/timeouts`` where calls have a time limit)."""
        out = {"reward/errors": float(self.errors), "reward/calls": float(self.calls)}
        if self.timeout_s is not None:
            out["reward/timeouts"] = float(self.timeouts)
        return out


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
        """``reward/errors``: failed component calls (all components); ``reward/calls``: samples scored;
        ``reward/timeouts``: calls of plugin components cut off (where a component has a time limit)."""
        out = {"reward/errors": float(self.errors), "reward/calls": float(self.calls)}
        if any(fn.timeout_s is not None for _, _, fn in self.parts):
            out["reward/timeouts"] = float(sum(fn.timeouts for _, _, fn in self.parts))
        return out


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


# What a sample carries to the platform of its components (``wire.SampleIn.reward_parts``'s bounds).
MAX_SAMPLE_PARTS = 32
MAX_PART_LABEL = 200


def sample_parts(extra: dict[str, Any]) -> dict[str, float] | None:
    """A sample's component scores by label (``extra["reward/<label>"]`` -> ``<label>``), for its example
    (``ExampleSample.reward_parts``): finite ones with labels of at most ``MAX_PART_LABEL`` characters,
    the first ``MAX_SAMPLE_PARTS`` in label order; None when it has none."""
    parts: dict[str, float] = {}
    for key in sorted(extra):
        label = key[len(COMPONENT_PREFIX) :]
        if not key.startswith(COMPONENT_PREFIX) or not label or len(label) > MAX_PART_LABEL:
            continue
        try:
            value = float(extra[key])
        except (TypeError, ValueError):
            continue
        if math.isfinite(value) and len(parts) < MAX_SAMPLE_PARTS:
            parts[label] = value
    return parts or None
