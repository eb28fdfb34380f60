"""``model.lora`` with the REAL vLLM worker (vLLM's CPU build): ``model.lora.sync: auto`` gives vLLM the
merged weights (every base weight with the adapters merged in, under the base model's names:
``rl_engine.models.lora.MergedWeights``). A trainer with peft adapters trained two steps on samples
vLLM generated; its weight stream loaded into the engine (``update_weights``, the object-store path of
test_worker.py): the engine's behaviour log-probs of fresh samples then equal the trainer's
recomputation (peft's unmerged forward, adapters on) within the full-weight test's tolerance, and
differ beyond it before the sync. Skipped without vLLM's CPU build.
"""

from __future__ import annotations

import time

import pytest
import torch

from rl_engine.backends import build_rollout_worker
from rl_engine.config.lora import sync_mode
from rl_engine.data import PromptStream
from rl_engine.rewards import build_reward
from rl_engine.trainer import PolicyTrainer
from tests.vllm_cpu.conftest import figure, vllm_cpu_config
from tests.vllm_cpu.test_worker import LOGPROB_ATOL, TEMPERATURE

pytestmark = pytest.mark.timeout(1800)  # one engine start on a loaded 2-core machine takes minutes


@pytest.fixture(scope="module")
def cfg(hd64_model_dir):
    return vllm_cpu_config(
        hd64_model_dir,
        f"rollout={{backend: vllm, device: cpu, n: 4, max_new_tokens: 16, temperature: {TEMPERATURE}, "
        "enforce_eager: true, cpu_kvcache_space_gb: 1}",
        "model.lora={rank: 4, alpha: 8}",  # sync: auto
        "trainer.batch_size=16",
        "trainer.mini_batch_size=8",
        "trainer.lr=0.02",
    )


@pytest.fixture(scope="module")
def worker(cfg):
    t0 = time.perf_counter()
    w = build_rollout_worker(cfg)
    figure(f"engine start (LoRA module): {time.perf_counter() - t0:.1f} s")
    yield w
    w.close()


def _scored_batch(cfg, worker, stream):
    """Samples vLLM generated, scored by the run's reward plus a fixed rule (the untrained policy almost
    never earns a reward: the rule makes the advantages non-zero), as tests/engine/test_trainer.py does."""
    samples = worker.generate(stream.next_batch(cfg.trainer.batch_size // cfg.rollout.n), cfg.rollout.n)
    reward = build_reward(cfg.reward)
    for i, s in enumerate(samples):
        s.reward = reward(s) + float(i % 3 == 0)
    return samples


def _max_diff(trainer, samples) -> float:
    assert all(len(s.logprobs) == len(s.response_ids) > 0 for s in samples)
    recomputed = trainer.compute_logprobs(samples)
    return max(
        abs(a - b)
        for s, r in zip(samples, recomputed, strict=True)
        for a, b in zip(s.logprobs, r, strict=True)
    )


def test_a_merged_sync_makes_vllms_logprobs_the_lora_trainers(cfg, worker):
    assert sync_mode(cfg.model.lora, "vllm") == "merged"
    stream = PromptStream(cfg, worker.tokenizer)
    trainer = PolicyTrainer(cfg)
    adapters = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_B" in n}
    assert adapters  # peft's adapters, B initialised to zero
    for _ in range(2):
        trainer.train_step(_scored_batch(cfg, worker, stream))
    moved = [
        n for n, p in trainer.model.named_parameters() if n in adapters and not torch.equal(p, adapters[n])
    ]
    assert moved, "two steps left every adapter where it was"

    before = worker.generate(stream.next_batch(4), 4)  # the engine still holds the base weights
    stale = _max_diff(trainer, before)
    figure(f"LoRA before the merged sync: |engine - trainer| log-prob max {stale:.2e}")
    assert stale > 10 * LOGPROB_ATOL

    weights = trainer.weight_stream(split=False)
    names = [name for name, _ in weights.items()]
    assert names and not any("lora_" in n or "base_layer" in n for n in names)  # the base model's names
    t0 = time.perf_counter()
    worker.update_weights(trainer.weight_stream(split=False), version=1)
    figure(
        f"LoRA merged sync into vLLM (object store): {1e3 * (time.perf_counter() - t0):.0f} ms, {len(names)} tensors"
    )
    assert worker.version == 1

    after = worker.generate(stream.next_batch(4), 4)
    assert all(s.param_version_start == s.param_version_end == 1 for s in after)
    diff = _max_diff(trainer, after)
    figure(f"LoRA after the merged sync: |engine - trainer| log-prob max {diff:.2e}")
    assert diff < LOGPROB_ATOL
