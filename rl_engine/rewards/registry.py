"""Reward functions behind a registry, looked up by name with keyword arguments from the config.

A reward factory takes the config's kwargs and returns ``RewardFn(sample) -> float``. Nothing here
evaluates user-supplied code: the only user-controlled inputs are plain values and (for ``format``)
a regular expression. ``build_reward`` wraps the function in ``SafeReward``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

from rl_engine.config import RewardConfig
from rl_engine.rewards.base import RewardFn, SafeReward
from rl_engine.rewards.math_answers import math_verify_reward
from rl_engine.rewards.text_answers import contains, exact_match, format_match, numeric_answer

REWARDS: dict[str, Callable[..., RewardFn]] = {
    "exact_match": exact_match,
    "contains": contains,
    "numeric_answer": numeric_answer,
    "format": format_match,
    "math_verify": math_verify_reward,
}


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
