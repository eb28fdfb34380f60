"""The rollout backends, keyed by ``rollout.backend``: the one place that tells them apart.

Each entry says how the backend's worker is built, how the trainer opens its side of a broadcast sync
to it, and whether its buckets must hold whole tensors. Code that needs one of these asks the entry
(``build_rollout_worker`` asks it for a worker); it never compares the backend's name (the config's
validators check a ``Literal`` field, nothing more). Every callable imports its backend's modules when
called: reading the table loads neither vllm nor sglang nor torch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rl_engine.config import ExperimentConfig
    from rl_engine.rollout.base import RolloutWorker
    from rl_engine.weights.broadcast import BucketSender, GroupInit


@dataclass(frozen=True)
class RolloutBackend:
    name: str
    worker: Callable[[ExperimentConfig, int], RolloutWorker]  # (config, sampling seed) -> the worker
    open_sender: Callable[[GroupInit], BucketSender]  # the trainer's side, rank 0 (joins; blocks)
    # the worker loads whole tensors (an engine's ``load_weights``): buckets never split one; the HF
    # worker loads any element range, so its buckets keep the size bound even for a huge embedding
    whole_tensors: bool
    # the worker applies LoRA adapters synced on their own (``model.lora``); the config's list of such
    # backends, ``rl_engine.config.lora.LORA_BACKENDS``, is kept equal to these by a test (the others get
    # the merged weights: ``model.lora.sync``)
    adapters: bool = False


def _hf_worker(cfg: ExperimentConfig, seed: int) -> RolloutWorker:
    from rl_engine.backends.hf.worker import HFRolloutWorker

    return HFRolloutWorker(cfg.rollout, cfg.model, seed=seed, gpus=cfg.resources.rollout_gpus)


def _hf_sender(init: GroupInit) -> BucketSender:
    from rl_engine.backends.hf.weights import open_sender

    return open_sender(init)


def _vllm_worker(cfg: ExperimentConfig, seed: int) -> RolloutWorker:
    from rl_engine.backends.vllm.worker import VLLMRolloutWorker

    return VLLMRolloutWorker(cfg.rollout, cfg.model, seed=seed)


def _vllm_sender(init: GroupInit) -> BucketSender:
    from rl_engine.backends.vllm.weights import open_sender

    return open_sender(init)


def _sglang_worker(cfg: ExperimentConfig, seed: int) -> RolloutWorker:
    from rl_engine.backends.sglang.worker import SGLangRolloutWorker

    return SGLangRolloutWorker(cfg.rollout, cfg.model, seed=seed)


def _sglang_sender(init: GroupInit) -> BucketSender:
    from rl_engine.backends.sglang.weights import open_sender

    return open_sender(init)


BACKENDS: dict[str, RolloutBackend] = {
    b.name: b
    for b in (
        RolloutBackend("hf", _hf_worker, _hf_sender, whole_tensors=False, adapters=True),
        RolloutBackend("vllm", _vllm_worker, _vllm_sender, whole_tensors=True),
        RolloutBackend("sglang", _sglang_worker, _sglang_sender, whole_tensors=True),
    )
}


def rollout_backend(name: str) -> RolloutBackend:
    """The entry of ``rollout.backend`` ``name``."""
    try:
        return BACKENDS[name]
    except KeyError:
        raise ValueError(f"unknown rollout backend {name!r}") from None


def rollout_seed(seed: int, index: int) -> int:
    """Sampling seed of rollouter ``index``: ``seed`` itself for rollouter 0 (a one-rollouter run
    samples as before), a distinct one for every other rollouter, so that several rollouters do not
    draw the same random numbers. Kept below 2**31 (engines take a 32-bit seed)."""
    return (seed + index * 1_000_003) % 2**31


def build_rollout_worker(cfg: ExperimentConfig, index: int = 0) -> RolloutWorker:
    """The worker for ``cfg.rollout.backend`` (its entry in ``BACKENDS``), built from (rollout config,
    model config) alone; ``index`` (the rollouter's) only picks the sampling seed (``rollout_seed``)."""
    return rollout_backend(cfg.rollout.backend).worker(cfg, rollout_seed(cfg.seed, index))
