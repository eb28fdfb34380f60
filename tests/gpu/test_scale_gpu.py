"""The trainer and the HF worker on CUDA (marked ``gpu``: skipped without a GPU).

The same checks run on CPU in tests/engine/test_scale.py; here: everything lands on the GPU, bf16
autocast on CUDA agrees with the CPU float32 trainer, and ``scripts/gpu_check.sh --quick`` passes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rl_engine.backends import build_rollout_worker
from rl_engine.config import apply_overrides, parse_config
from rl_engine.presets import get_preset
from rl_engine.trainer import PolicyTrainer

pytestmark = pytest.mark.gpu
REPO = Path(__file__).resolve().parents[2]


def _cfg(model_dir, *overrides: str):
    data = get_preset("demo-cpu")
    data["model"].pop("tiny")
    base = [
        f"model.path={model_dir}",
        "trainer.batch_size=16",
        "trainer.mini_batch_size=16",
        "rollout.max_new_tokens=8",
        "resources.trainer_gpus=1",
        "resources.rollout_gpus=1",
    ]
    return parse_config(apply_overrides(data, [*base, *overrides]))


def test_trainer_and_worker_live_on_cuda_and_agree_with_cpu(tiny_model_dir):
    cfg = _cfg(tiny_model_dir, "algorithm.kl_coef=0.1", "algorithm.off_policy=tis")
    trainer, worker = PolicyTrainer(cfg), build_rollout_worker(cfg)  # device auto: a GPU is reserved
    assert trainer.device.type == "cuda" and worker.device.type == "cuda"
    samples = worker.generate(worker_prompts(cfg, worker), cfg.rollout.n)
    for i, s in enumerate(samples):
        s.reward = float(i % 2)
    data = trainer._prepare(samples)
    trainer.train_step(samples)
    tensors = [
        *trainer.model.parameters(),
        *trainer.ref_model.parameters(),
        data.adv,
        data.old,
        data.mask,
        data.batch.input_ids,
        *(v for st in trainer.optimizer.state.values() for v in st.values() if v.dim()),
    ]
    assert {t.device.type for t in tensors} == {"cuda"}
    cpu = PolicyTrainer(_cfg(tiny_model_dir, "trainer.device=cpu"))
    cpu.model.load_state_dict({k: v.cpu() for k, v in trainer.model.state_dict().items()})
    a, b = trainer.compute_logprobs(samples), cpu.compute_logprobs(samples)
    assert max(abs(x - y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True)) < 1e-3
    worker.update_weights(trainer.weight_stream(), trainer.version)
    assert all(
        torch.equal(p, dict(trainer.model.named_parameters())[k].to(p.dtype))
        for k, p in worker.model.named_parameters()
    )


def worker_prompts(cfg, worker):
    from rl_engine.data import PromptStream

    return PromptStream(cfg, worker.tokenizer).next_batch(cfg.trainer.batch_size // cfg.rollout.n)


def test_gpu_check_quick_passes_on_cuda():
    proc = subprocess.run(
        [sys.executable, "scripts/gpu_check.py", "--device", "cuda", "--quick"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["ok"], out["checks"]
    assert out["step"]["peak_extra_gb"] > 0
