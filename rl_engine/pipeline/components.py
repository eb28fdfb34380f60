"""Which classes the pipeline actors build: the real engine parts by default, simulated ones in the
orchestration tests and the long-tail benchmark (``harness/simulated.py``: GPU engines cannot
run here; the simulated parts model their *costs*, everything around them — actors, queue, sync,
gates — is the real code).

A factory is named by ``"module:attribute"`` so it can be shipped to Ray worker processes by name.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

from rl_engine.config import ExperimentConfig


@dataclass(frozen=True)
class Factory:
    """A callable named by import path, called as ``fn(cfg, **kwargs)`` (plus ``index=`` for rollouters)."""

    path: str
    kwargs: dict[str, Any] = field(default_factory=dict)

    def build(self, cfg: ExperimentConfig, **extra: Any) -> Any:
        module, _, attr = self.path.partition(":")
        fn = getattr(importlib.import_module(module), attr)
        return fn(cfg, **self.kwargs, **extra)


@dataclass(frozen=True)
class Components:
    """The four pluggable parts: rollout worker, prompt stream, reward function, policy trainer."""

    worker: Factory = Factory("rl_engine.pipeline.components:real_worker")
    prompts: Factory = Factory("rl_engine.pipeline.components:real_prompts")
    reward: Factory = Factory("rl_engine.pipeline.components:real_reward")
    trainer: Factory = Factory("rl_engine.pipeline.components:real_trainer")
    prepare: Factory | None = Factory("rl_engine.pipeline.components:real_prepare")


def real_prepare(cfg: ExperimentConfig) -> None:
    """Build the tiny model once in the driver, before actors race to load it."""
    from rl_engine.models import ensure_model

    ensure_model(cfg.model)


def real_worker(cfg: ExperimentConfig, index: int = 0) -> Any:
    from rl_engine.backends import build_rollout_worker

    worker = build_rollout_worker(cfg, index=index)  # each rollouter samples with its own seed
    if cfg.env.name is None:
        return worker
    from rl_engine.envs.registry import build_episode_worker
    from rl_engine.rewards import build_reward

    # multi-turn: each sample an episode with the environment, which judges turns with the run's reward
    return build_episode_worker(worker, cfg, build_reward(cfg.reward))


def real_prompts(cfg: ExperimentConfig, index: int = 0) -> Any:
    from rl_engine.data import PromptStream
    from rl_engine.models import load_tokenizer

    return PromptStream(cfg, load_tokenizer(cfg.model))


def real_reward(cfg: ExperimentConfig, index: int = 0) -> Any:
    from rl_engine.rewards import build_reward

    if cfg.env.name is None:
        return build_reward(cfg.reward)
    from rl_engine.envs.registry import EpisodeReward

    return EpisodeReward(
        build_reward(cfg.reward)
    )  # the environment's reward of an episode, where it gives one


def real_trainer(cfg: ExperimentConfig, ranks: Any = None) -> Any:
    """One rank's trainer (``ranks``: its place in the trainer group; None: the only rank)."""
    from rl_engine.trainer import PolicyTrainer

    return PolicyTrainer(cfg, ranks=ranks)
