"""The policy update: losses from ``rl_engine.algos``, optimizer, schedule, checkpoint/resume."""

from __future__ import annotations

from rl_engine.trainer.policy import PolicyTrainer

__all__ = ["PolicyTrainer"]
