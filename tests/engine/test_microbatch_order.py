"""``trainer.micro_batch_order length``: rows sorted longest first before micro-batches are cut pad less
and give the same log-probs and the same gradient as the shuffled order (``shuffled``, the order before).

Tolerances: log-probs 1e-5 absolute (each row's forward runs at another padded width: float32 matmuls
of other shapes); gradients 1e-5 of the largest entry (float32 sums of the micro-batches in another
order); the loss metrics 1e-6 relative.
"""

from __future__ import annotations

import pytest
import torch

from harness.trainer_group import synthetic_samples
from rl_engine.trainer import PolicyTrainer
from rl_engine.trainer.microbatch import plan_micro_batches, plan_rows

BASE = ("trainer.batch_size=16", "trainer.mini_batch_size=16", "trainer.max_tokens_per_micro_batch=60",
        "trainer.grad_clip=null", "rollout.n=4")  # fmt: skip


def _padded_tokens(plan: list[list[int]], lens: list[int]) -> int:
    return sum(len(g) * max(lens[i] for i in g) for g in plan)


def test_plan_rows_covers_every_row_once_within_the_budget():
    prompt = [4, 9, 2, 7, 3, 8, 5, 6, 1, 9]
    response = [6, 1, 9, 3, 8, 2, 5, 4, 7, 12]
    lens = [p + r for p, r in zip(prompt, response, strict=True)]
    for order in ("length", "shuffled"):
        plan = plan_rows(prompt, response, max_rows=4, max_tokens=36, order=order)
        assert sorted(i for g in plan for i in g) == list(range(10))
        assert all(len(g) <= 4 and (len(g) == 1 or len(g) * max(lens[i] for i in g) <= 36) for g in plan)
    assert plan_rows(prompt, response, 4, 36, "shuffled") == plan_micro_batches(prompt, response, 4, 36)
    by_length = plan_rows(prompt, response, 4, 36, "length")
    assert [max(lens[i] for i in g) for g in by_length] == sorted((max(lens[i] for i in g) for g in by_length),
                                                                  reverse=True)  # fmt: skip
    assert _padded_tokens(by_length, lens) < _padded_tokens(
        plan_rows(prompt, response, 4, 36, "shuffled"), lens
    )
    with pytest.raises(ValueError):
        plan_rows(prompt, response, 4, 36, "random")


def test_length_order_gives_the_shuffled_orders_log_probs_and_gradient(make_cfg):
    shuffled = PolicyTrainer(make_cfg(*BASE, "trainer.micro_batch_order=shuffled"))
    by_length = PolicyTrainer(make_cfg(*BASE, "trainer.micro_batch_order=length"))
    vocab = shuffled.model.get_output_embeddings().weight.shape[0]
    samples = synthetic_samples(16, 4, vocab, seed=3, prompt_len=(2, 12), response_len=(1, 14))
    lens = [len(s.prompt_ids) + len(s.response_ids) for s in samples]
    prompt, response = [len(s.prompt_ids) for s in samples], [len(s.response_ids) for s in samples]
    plans = {o: plan_rows(prompt, response, 16, 60, o) for o in ("shuffled", "length")}
    assert _padded_tokens(plans["length"], lens) < _padded_tokens(plans["shuffled"], lens)  # the point
    assert len(plans["length"]) > 1  # several micro-batches: the grouping matters

    for a, b in zip(shuffled.compute_logprobs(samples), by_length.compute_logprobs(samples), strict=True):
        torch.testing.assert_close(torch.tensor(b), torch.tensor(a), rtol=0, atol=1e-5)

    m_a, m_b = shuffled.train_step(samples), by_length.train_step(samples)
    for k in ("actor/pg_loss", "actor/approx_kl", "actor/clipfrac", "actor/entropy"):
        assert m_b[k] == pytest.approx(m_a[k], rel=1e-6, abs=1e-9), k
    g_a = {k: p.grad for k, p in shuffled.model.named_parameters()}
    g_b = {k: p.grad for k, p in by_length.model.named_parameters()}
    scale = max(float(g.abs().max()) for g in g_a.values())
    assert scale > 0
    for k in g_a:
        torch.testing.assert_close(g_b[k], g_a[k], rtol=0, atol=1e-5 * scale)
