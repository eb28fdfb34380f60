"""Rollout workers: one standalone class per backend behind the contract in ``base``.

Backends import their engine lazily: building an ``hf`` worker never imports vllm or sglang.
"""

from __future__ import annotations

from rl_engine.config import ExperimentConfig
from rl_engine.rollout.base import RolloutWorker


def build_rollout_worker(cfg: ExperimentConfig) -> RolloutWorker:
    """The worker for ``cfg.rollout.backend``, built from (rollout config, model config) alone."""
    backend = cfg.rollout.backend
    if backend == "hf":
        from rl_engine.rollout.hf import HFRolloutWorker

        return HFRolloutWorker(cfg.rollout, cfg.model, seed=cfg.seed, gpus=cfg.resources.rollout_gpus)
    if backend == "vllm":
        from rl_engine.rollout.vllm import VLLMRolloutWorker

        return VLLMRolloutWorker(cfg.rollout, cfg.model, seed=cfg.seed)
    if backend == "sglang":
        from rl_engine.rollout.sglang import SGLangRolloutWorker

        return SGLangRolloutWorker(cfg.rollout, cfg.model, seed=cfg.seed)
    raise ValueError(f"unknown rollout backend {backend!r}")


__all__ = ["RolloutWorker", "build_rollout_worker"]
