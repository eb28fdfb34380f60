"""Dropout is off in every model the engine trains or scores: recomputed log-probs are deterministic
and on-policy importance ratios are exactly 1, even for a model whose config asks for dropout."""

from __future__ import annotations

from pathlib import Path

import torch

from rl_engine.config import ModelConfig
from rl_engine.models import load_model
from rl_engine.trainer import PolicyTrainer
from tests.engine.test_trainer import _scored_batch


def _gpt2_with_dropout(path: Path) -> Path:
    """A tiny GPT-2 (nn.Dropout modules for embeddings, attention and residuals) with dropout 0.3."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(
        vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.3, embd_pdrop=0.3
    )
    cfg.attn_pdrop = 0.3
    GPT2LMHeadModel(cfg).save_pretrained(path)
    return path


def test_a_model_whose_config_has_dropout_loads_without_it(tmp_path: Path):
    from transformers import AutoModelForCausalLM

    path = _gpt2_with_dropout(tmp_path / "gpt2")
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    # the checkpoint as it is: in training mode two forwards differ (dropout is really configured)
    plain = AutoModelForCausalLM.from_pretrained(str(path)).train()
    assert not torch.equal(plain(input_ids=ids).logits, plain(input_ids=ids).logits)

    model = load_model(ModelConfig(path=str(path)), training=True).train()
    assert model.config.resid_pdrop == model.config.embd_pdrop == model.config.attn_pdrop == 0.0
    dropouts = [m for m in model.modules() if isinstance(m, torch.nn.Dropout)]
    assert dropouts and all(m.p == 0.0 for m in dropouts)
    first = model(input_ids=ids).logits
    assert torch.equal(first, model(input_ids=ids).logits)
    first.sum().backward()  # training mode and gradients are kept
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_trainer_recomputations_are_identical_and_on_policy_ratios_are_one(make_cfg):
    # the tiny Llama with attention dropout 0.5: a probability the model reads at each training forward
    cfg = make_cfg(
        "trainer.batch_size=8",
        "trainer.mini_batch_size=8",
        "rollout.n=4",
        "rollout.max_new_tokens=6",
        "algorithm.off_policy=decoupled",
        "model.override_config.attention_dropout=0.5",
    )
    trainer = PolicyTrainer(cfg)
    assert trainer.model.training and trainer.model.config.attention_dropout == 0.0
    samples = _scored_batch(cfg)
    batch = trainer.pack_samples(samples)
    # the old / proximal log-probs are computed with the model in training mode, as in a step
    a = trainer._logprobs_no_grad(trainer.policy, batch)
    b = trainer._logprobs_no_grad(trainer.policy, batch)
    assert torch.equal(a, b)
    for s, lp in zip(samples, trainer.compute_logprobs(samples), strict=True):
        s.logprobs = lp  # behaviour = the current weights: on-policy data
    m = trainer.train_step(samples)
    assert m["off_policy/is_ratio_mean"] == 1.0 and m["off_policy/is_ratio_max"] == 1.0
    assert m["off_policy/tis_clipfrac"] == 0.0
