"""Algorithms as pure tensor functions, picked by name from registries (see docs/engine.md for formulas)."""

from __future__ import annotations

from rl_engine.algos.advantages import (
    ADVANTAGES,
    dr_grpo,
    group_indices,
    group_stats,
    grpo,
    reinforce_pp,
    rloo,
)
from rl_engine.algos.losses import (
    LOSS_AGGS,
    PolicyLossOut,
    aggregate,
    filtered_is_weights,
    kl_k3,
    masked_mean,
    ppo_clip_loss,
    truncated_is_weights,
)


def get_advantage_fn(name: str):
    if name not in ADVANTAGES:
        raise ValueError(
            f"unknown advantage estimator {name!r}; choose one of {', '.join(sorted(ADVANTAGES))}"
        )
    return ADVANTAGES[name]


__all__ = [
    "ADVANTAGES",
    "LOSS_AGGS",
    "PolicyLossOut",
    "aggregate",
    "dr_grpo",
    "filtered_is_weights",
    "get_advantage_fn",
    "group_indices",
    "group_stats",
    "grpo",
    "kl_k3",
    "masked_mean",
    "ppo_clip_loss",
    "reinforce_pp",
    "rloo",
    "truncated_is_weights",
]
