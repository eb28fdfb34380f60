"""``pipeline.mode`` sync and fully_async give the same update on the same batch.

What the mode changes on the trainer's path: nothing inside ``PolicyTrainer`` (it never reads
``cfg.pipeline``); the trainer actor checks each batch's staleness against the mode's bound before
training (``Knobs.batch_staleness``: 0 in sync, (B + 1) T - 1 in fully_async). The correction for a
stale batch is ``algorithm.off_policy``, a knob of its own that fully_async runs set: with ``tis`` the
ratio's old log-probs are recomputed at the current weights and each token's loss is weighted by
w = min(pi_current / pi_behaviour, tis_threshold). So:

1. sync and fully_async (off_policy none) on the same fresh batch: bit-identical weights after the step;
2. fully_async with ``tis`` on a fresh batch: w = 1 to float precision, the same gradient as sync's;
3. fully_async with ``tis`` on a batch one step stale (which sync refuses): the gradient is exactly
   -sum(adv * w * grad log pi) / tokens, checked against a plain transformers forward/backward of the
   same weights (full logits, log-softmax) with w computed from it.

The trainers are built as the pipeline builds them (``components.real_trainer``), on the tiny model.
"""

from __future__ import annotations

import copy

import pytest
import torch

from rl_engine.algos.advantages import get_advantage_fn, scored_advantages
from rl_engine.backends import build_rollout_worker
from rl_engine.data import PromptStream
from rl_engine.pipeline.components import real_trainer
from rl_engine.pipeline.knobs import StalenessViolation, knobs_from_config

BASE = ("trainer.batch_size=8", "trainer.mini_batch_size=8", "rollout.max_new_tokens=6",
        "rollout.n=4", "trainer.grad_clip=null")  # fmt: skip
SYNC = ("pipeline.mode=sync",)
ASYNC = ("pipeline.mode=fully_async", "pipeline.staleness_threshold=1")


def _batches(cfg, count: int) -> list[list]:
    """``count`` scored batches generated on the initial weights (rewards by a fixed rule)."""
    worker = build_rollout_worker(cfg)
    stream = PromptStream(cfg, worker.tokenizer)
    out = []
    for _ in range(count):
        samples = worker.generate(stream.next_batch(cfg.trainer.batch_size // cfg.rollout.n), cfg.rollout.n)
        for i, s in enumerate(samples):
            s.reward = float(i % 3 == 0)
        out.append(samples)
    return out


def _weights(trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.model.named_parameters()}


def _grads(trainer) -> dict[str, torch.Tensor]:
    """The last step's gradient (kept until the next step zeroes it; no clipping: grad_clip null)."""
    return {k: v.grad.detach().clone() for k, v in trainer.model.named_parameters()}


def test_sync_and_fully_async_give_bit_identical_weights_on_the_same_batch(make_cfg):
    sync_cfg, async_cfg = make_cfg(*BASE, *SYNC), make_cfg(*BASE, *ASYNC)
    [batch] = _batches(sync_cfg, 1)
    sync, fully_async = real_trainer(sync_cfg), real_trainer(async_cfg)
    before = _weights(sync)
    # a fresh batch passes both modes' staleness check
    assert knobs_from_config(sync_cfg).batch_staleness(0, batch) == [0] * 8
    assert knobs_from_config(async_cfg).batch_staleness(0, batch) == [0] * 8
    sync.train_step(batch)
    fully_async.train_step(batch)
    a, b = _weights(sync), _weights(fully_async)
    assert any(not torch.equal(before[k], a[k]) for k in a)  # the step moved the weights
    for k in a:
        assert torch.equal(a[k], b[k]), k  # tolerance 0


def test_fully_async_with_tis_on_a_fresh_batch_gives_syncs_gradient(make_cfg):
    sync_cfg, tis_cfg = make_cfg(*BASE, *SYNC), make_cfg(*BASE, *ASYNC, "algorithm.off_policy=tis")
    [batch] = _batches(sync_cfg, 1)
    sync, tis = real_trainer(sync_cfg), real_trainer(tis_cfg)
    sync.train_step(batch)
    metrics = tis.train_step(batch)
    # w = exp(recomputed - behaviour): the worker's and the trainer's log-probs agree to ~1e-6
    assert metrics["off_policy/is_ratio_max"] == pytest.approx(1.0, abs=1e-4)
    g_sync, g_tis = _grads(sync), _grads(tis)
    scale = max(float(g.abs().max()) for g in g_sync.values())
    for k in g_sync:  # tolerance: 1e-4 of the largest gradient entry (w = 1 +- 1e-5)
        torch.testing.assert_close(g_tis[k], g_sync[k], rtol=0, atol=1e-4 * scale)


def _reference_gradient(model, samples, adv, temperature, threshold):
    """-sum(adv * w * grad log pi) / tokens, one sample at a time on plain transformers logits."""
    model = copy.deepcopy(model)
    model.zero_grad(set_to_none=True)
    tokens = sum(len(s.response_ids) for s in samples)
    weights = []
    for s, a in zip(samples, adv.tolist(), strict=True):
        ids = torch.tensor([s.prompt_ids + s.response_ids])
        logits = model(input_ids=ids).logits[0].float() / temperature
        p = len(s.prompt_ids)
        targets = torch.tensor(s.response_ids)[:, None]
        logp = torch.log_softmax(logits[p - 1 : -1], -1).gather(1, targets)[:, 0]
        w = torch.exp(logp.detach() - torch.tensor(s.logprobs)).clamp(max=threshold)
        weights.append(w)
        (-(a * w * logp).sum() / tokens).backward()
    return {k: v.grad.detach().clone() for k, v in model.named_parameters()}, torch.cat(weights)


def test_fully_async_with_tis_on_a_stale_batch_weighs_each_token_by_the_truncated_ratio(make_cfg):
    sync_cfg, tis_cfg = make_cfg(*BASE, *SYNC), make_cfg(*BASE, *ASYNC, "algorithm.off_policy=tis")
    first, stale = _batches(tis_cfg, 2)  # both generated on version 0
    trainer = real_trainer(tis_cfg)
    trainer.train_step(first)  # version 1: ``stale`` is one step old
    with pytest.raises(StalenessViolation):  # sync never trains on it
        knobs_from_config(sync_cfg).batch_staleness(trainer.version, stale)
    assert knobs_from_config(tis_cfg).batch_staleness(trainer.version, stale) == [1] * 8
    adv = scored_advantages(get_advantage_fn(tis_cfg.algorithm.advantage), stale, norm_by_std=True)
    expected, w = _reference_gradient(trainer.model, stale, adv, tis_cfg.rollout.temperature,
                                      tis_cfg.algorithm.tis_threshold)  # fmt: skip
    assert float((w - 1).abs().max()) > 1e-3  # the batch is off-policy: the weights are not all 1
    trainer.train_step(stale)
    got = _grads(trainer)
    scale = max(float(g.abs().max()) for g in expected.values())
    for k in expected:  # tolerance: 1e-4 of the largest gradient entry (float32 sums in other orders)
        torch.testing.assert_close(got[k], expected[k], rtol=0, atol=1e-4 * scale)
