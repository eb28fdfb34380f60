"""Rewards: the contract and its crash-proof wrapper (``base``), the built-in rewards (``text_answers``,
``math_answers``) and the registry the config names them from (``registry``, ``build_reward``)."""

from rl_engine.rewards.base import RewardFn, SafeReward, WeightedSum, component_means
from rl_engine.rewards.registry import REWARDS, build_reward, reward_names
from rl_engine.rewards.text_answers import extract_number

__all__ = [
    "REWARDS",
    "RewardFn",
    "SafeReward",
    "WeightedSum",
    "build_reward",
    "component_means",
    "extract_number",
    "reward_names",
]
