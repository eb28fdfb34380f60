"""Learning-rate schedules counted in *optimizer* steps.

One trainer step = ``(batch_size / mini_batch_size) * ppo_epochs`` optimizer steps; the schedule's
length is ``total_steps`` times that, and ``warmup_steps`` (given in trainer steps) is converted the
same way. The multiplier never reaches 0 before the last optimizer step: step ``k`` (0-based) of ``N``
decays with ``(N - k) / (N - W)``, so the last step still gets ``1 / (N - W)`` of the way above the floor.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from rl_engine.config import TrainerConfig


def optimizer_steps_per_trainer_step(cfg: TrainerConfig) -> int:
    return (cfg.batch_size // cfg.mini_batch_size) * cfg.ppo_epochs


def lr_multiplier(kind: str, total: int, warmup: int, min_ratio: float) -> Callable[[int], float]:
    """k (0-based optimizer step) -> multiplier of the base LR, for a run of ``total`` optimizer steps."""
    if total < 1:
        raise ValueError("total optimizer steps must be >= 1")
    warmup = min(warmup, total - 1)

    def fn(k: int) -> float:
        if k < warmup:
            return (k + 1) / warmup  # starts above 0, reaches 1 on the last warmup step
        if kind == "constant":
            return 1.0
        frac_left = (total - k) / (total - warmup)  # 1 at the first decayed step, 1/(N-W) at the last
        frac_left = min(max(frac_left, 0.0), 1.0)
        if kind == "linear":
            shape = frac_left
        elif kind == "cosine":
            shape = 0.5 * (1.0 - math.cos(math.pi * frac_left))
        else:
            raise ValueError(f"unknown lr_schedule {kind!r}")
        return min_ratio + (1.0 - min_ratio) * shape

    return fn


def build_lr_multiplier(cfg: TrainerConfig) -> tuple[Callable[[int], float], int]:
    """The schedule for a trainer config and its total number of optimizer steps."""
    per = optimizer_steps_per_trainer_step(cfg)
    total = cfg.total_steps * per
    return lr_multiplier(cfg.lr_schedule, total, cfg.warmup_steps * per, cfg.min_lr_ratio), total
