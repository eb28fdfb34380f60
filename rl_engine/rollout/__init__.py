"""Rollout workers: one standalone class per backend behind the contract in ``base``.

Backends import their engine lazily: building an ``hf`` worker never imports vllm or sglang.
"""

from __future__ import annotations

from rl_engine.config import ExperimentConfig
from rl_engine.rollout.base import RolloutWorker
from rl_engine.weights.registry import rollout_backend


def rollout_seed(seed: int, index: int) -> int:
    """Sampling seed of rollouter ``index``: ``seed`` itself for rollouter 0 (a one-rollouter run
    samples as before), a distinct one for every other rollouter, so that several rollouters do not
    draw the same random numbers. Kept below 2**31 (engines take a 32-bit seed)."""
    return (seed + index * 1_000_003) % 2**31


def build_rollout_worker(cfg: ExperimentConfig, index: int = 0) -> RolloutWorker:
    """The worker for ``cfg.rollout.backend`` (its entry in ``rl_engine.weights.registry``), built from
    (rollout config, model config) alone; ``index`` (the rollouter's) only picks the sampling seed
    (``rollout_seed``)."""
    return rollout_backend(cfg.rollout.backend).worker(cfg, rollout_seed(cfg.seed, index))


__all__ = ["RolloutWorker", "build_rollout_worker", "rollout_seed"]
