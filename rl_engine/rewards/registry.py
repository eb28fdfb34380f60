"""Reward functions behind a registry, looked up by name with keyword arguments from the config.

A reward factory takes the config's kwargs and returns ``RewardFn(sample) -> float``. Nothing here
evaluates user-supplied code: the only user-controlled inputs are plain values and (for ``format``)
a regular expression. ``build_reward`` wraps the function in ``SafeReward``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from rl_engine.rewards.base import RewardFn, SafeReward, WeightedSum
from rl_engine.rewards.math_answers import math_verify_reward
from rl_engine.rewards.reasoning_gym import reasoning_gym_reward
from rl_engine.rewards.text_answers import contains, exact_match, format_match, numeric_answer

REWARDS: dict[str, Callable[..., RewardFn]] = {
    "exact_match": exact_match,
    "contains": contains,
    "numeric_answer": numeric_answer,
    "format": format_match,
    "math_verify": math_verify_reward,
    "reasoning_gym": reasoning_gym_reward,
}


def reward_names() -> list[str]:
    return sorted(REWARDS)


def bound_reward(name: str, kwargs: dict[str, Any]) -> RewardFn:
    """The reward ``name`` built with ``kwargs``: ValueError (one line) for an unknown name, an argument
    it does not take, or a value it refuses (a range, a type, a pattern RE2 does not accept). The config
    calls this when it is checked (``RewardConfig``), so the platform answers a 400 at create instead of
    the job failing later."""
    factory = REWARDS.get(name)
    if factory is None:
        raise ValueError(f"unknown reward {name[:80]!r}; choose one of {', '.join(reward_names())}")
    sig = inspect.signature(factory)
    try:
        sig.bind(**kwargs)
    except TypeError as exc:
        params = ", ".join(sig.parameters) or "none"
        got = ", ".join(repr(k[:80]) for k in sorted(kwargs)[:20])
        raise ValueError(
            f"reward {name!r} got arguments [{got}] ({str(exc)[:200]}); it takes: {params}"
        ) from None
    try:
        return factory(**kwargs)
    except TypeError as exc:  # a value of the wrong type met an operator or a comparison
        raise ValueError(f"reward {name!r}: an argument has the wrong type ({exc})") from None


class ComponentSpec(Protocol):
    """One component of ``reward.combine`` (``rl_engine.config.RewardComponent``)."""

    name: str
    kwargs: dict[str, Any]
    weight: float

    @property
    def key(self) -> str: ...


class RewardSpec(Protocol):
    """What names a reward: ``rl_engine.config.RewardConfig`` (the config checks its arguments with
    ``bound_reward``, so this package imports nothing of the config's)."""

    name: str
    kwargs: dict[str, Any]
    combine: Sequence[ComponentSpec] | None


def build_reward(reward_cfg: RewardSpec) -> SafeReward | WeightedSum:
    """Look up ``reward_cfg.name`` and bind ``reward_cfg.kwargs`` (``bound_reward``); the function comes
    back wrapped in ``SafeReward``. With ``reward_cfg.combine``: a ``WeightedSum`` of its components,
    each built the same way."""
    combine = getattr(reward_cfg, "combine", None)
    if combine:
        return WeightedSum(
            [
                (part.key, float(part.weight), SafeReward(bound_reward(part.name, part.kwargs), part.key))
                for part in combine
            ]
        )
    return SafeReward(bound_reward(reward_cfg.name, reward_cfg.kwargs), reward_cfg.name)
