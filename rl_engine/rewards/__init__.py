"""Reward functions behind a registry, looked up by name with keyword arguments from the config.

A reward factory takes the config's kwargs and returns ``RewardFn(sample) -> float``. Nothing here
evaluates user-supplied code: the only user-controlled inputs are plain values and (for ``format``)
a regular expression. ``build_reward`` wraps the function in ``SafeReward``: a reward that raises
(or returns NaN) scores 0 for that sample, is counted and logged, and never stops the rollout.
"""

from __future__ import annotations

import inspect
import logging
import math
import re
import threading
from collections.abc import Callable

from rl_engine.config import RewardConfig
from rl_engine.rewards.math_answers import math_verify_reward
from rl_engine.types import Sample

log = logging.getLogger(__name__)

RewardFn = Callable[[Sample], float]

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")


def _norm(text: str, strip: bool, case_sensitive: bool) -> str:
    text = text.strip() if strip else text
    return text if case_sensitive else text.lower()


def exact_match(strip: bool = True, case_sensitive: bool = True, prefix_credit: float = 0.0) -> RewardFn:
    """1.0 if the response equals the answer (after optional whitespace strip / case folding), else 0.0.

    ``prefix_credit`` (0 by default) is paid when the response starts with the answer but goes on:
    a shaping term that lets a policy learn the answer before it learns to stop right after it.
    """
    if not 0.0 <= prefix_credit <= 1.0:
        raise ValueError("prefix_credit must be between 0 and 1")

    def fn(sample: Sample) -> float:
        got = _norm(sample.response_text, strip, case_sensitive)
        want = _norm(sample.answer, strip, case_sensitive)
        if got == want:
            return 1.0
        return prefix_credit if want and got.startswith(want) else 0.0

    return fn


def contains(case_sensitive: bool = True) -> RewardFn:
    """1.0 if the answer appears anywhere in the response (a lenient shaping reward)."""

    def fn(sample: Sample) -> float:
        ans = _norm(sample.answer, True, case_sensitive)
        return float(bool(ans) and ans in _norm(sample.response_text, False, case_sensitive))

    return fn


def extract_number(text: str, marker: str | None = None) -> float | None:
    """The number after the last ``marker`` if present (e.g. GSM8K's ``####``), else the last number."""
    if marker and marker in text:
        text = text.rsplit(marker, 1)[1]
    found = _NUMBER.findall(text)
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


def numeric_answer(tolerance: float = 1e-6, marker: str | None = "####") -> RewardFn:
    """1.0 if the last number in the response equals the answer's number within ``tolerance``."""
    if tolerance < 0:
        raise ValueError("tolerance must be >= 0")

    def fn(sample: Sample) -> float:
        want = extract_number(sample.answer, marker)
        got = extract_number(sample.response_text, marker)
        if want is None or got is None or not math.isfinite(got):
            return 0.0
        return float(abs(want - got) <= tolerance)

    return fn


def format_match(pattern: str, full: bool = True, reward: float = 1.0) -> RewardFn:
    """``reward`` if the response matches the regular expression (whole response when ``full``), else 0."""
    try:
        regex = re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"pattern is not a valid regular expression: {exc}") from None
    match = regex.fullmatch if full else regex.search

    def fn(sample: Sample) -> float:
        return reward if match(sample.response_text.strip()) else 0.0

    return fn


REWARDS: dict[str, Callable[..., RewardFn]] = {
    "exact_match": exact_match,
    "contains": contains,
    "numeric_answer": numeric_answer,
    "format": format_match,
    "math_verify": math_verify_reward,
}


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


def reward_names() -> list[str]:
    return sorted(REWARDS)


def build_reward(reward_cfg: RewardConfig) -> SafeReward:
    """Look up ``reward_cfg.name`` and bind ``reward_cfg.kwargs`` (errors say which names/arguments
    exist); the function comes back wrapped in ``SafeReward``."""
    factory = REWARDS.get(reward_cfg.name)
    if factory is None:
        raise ValueError(f"unknown reward {reward_cfg.name!r}; choose one of {', '.join(reward_names())}")
    sig = inspect.signature(factory)
    try:
        sig.bind(**reward_cfg.kwargs)
    except TypeError:
        params = ", ".join(sig.parameters) or "none"
        raise ValueError(
            f"reward {reward_cfg.name!r} got arguments {sorted(reward_cfg.kwargs)}; it takes: {params}"
        ) from None
    return SafeReward(factory(**reward_cfg.kwargs), reward_cfg.name)


__all__ = ["REWARDS", "RewardFn", "SafeReward", "build_reward", "extract_number", "reward_names"]
