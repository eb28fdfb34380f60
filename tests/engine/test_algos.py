"""Advantage estimators and losses against values computed by hand (worked numbers in comments)."""

from __future__ import annotations

import math

import pytest
import torch

from rl_engine.algos.advantages import ADVANTAGES, group_indices
from rl_engine.algos.losses import aggregate, kl_k3, ppo_clip_loss, truncated_is_weights

# Two groups of four: group 0 rewards 1,0,0,1 (mean .5, unbiased std sqrt(1/3));
# group 1 rewards 1,1,1,0 (mean .75, unbiased std .5).
R = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0])
G = group_indices(["a", "a", "a", "a", "b", "b", "b", "b"])


def test_grpo_normalises_within_groups():
    s = 0.5 / math.sqrt(1 / 3)  # 0.866
    want = [s, -s, -s, s, 0.5, 0.5, 0.5, -1.5]
    assert ADVANTAGES["grpo"](R, G, eps=0.0).tolist() == pytest.approx(want, abs=1e-6)
    # Without std normalisation GRPO is just the centred reward (= Dr.GRPO).
    centred = [0.5, -0.5, -0.5, 0.5, 0.25, 0.25, 0.25, -0.75]
    assert ADVANTAGES["grpo"](R, G, norm_by_std=False).tolist() == pytest.approx(centred)
    assert ADVANTAGES["dr_grpo"](R, G).tolist() == pytest.approx(centred)


def test_group_of_identical_rewards_gets_zero_advantage():
    r = torch.tensor([1.0, 1.0, 0.0, 0.0])
    g = group_indices(["x", "x", "y", "y"])
    for name in ADVANTAGES:
        assert ADVANTAGES[name](r, g).abs().max() < 1e-6, name


def test_rloo_is_reward_minus_mean_of_the_others():
    # Last sample of group b: 0 - mean(1,1,1) = -1; first of group a: 1 - mean(0,0,1) = 2/3.
    want = [2 / 3, -2 / 3, -2 / 3, 2 / 3, 1 / 3, 1 / 3, 1 / 3, -1.0]
    assert ADVANTAGES["rloo"](R, G).tolist() == pytest.approx(want, abs=1e-6)


def test_reinforce_pp_whitens_the_centred_rewards_over_the_batch():
    # Centred rewards have batch mean 0 and unbiased std sqrt(1.75 / 7) = 0.5: advantages double.
    want = [1.0, -1.0, -1.0, 1.0, 0.5, 0.5, 0.5, -1.5]
    assert ADVANTAGES["reinforce_pp"](R, G, eps=0.0).tolist() == pytest.approx(want, abs=1e-6)


def test_group_indices_follow_first_appearance_not_sorting():
    assert group_indices(["z", "a", "z", "m"]).tolist() == [0, 1, 0, 2]


def test_ppo_clip_asymmetric_and_dual_clip_by_hand():
    ratio = torch.tensor([[1.5, 0.5, 5.0, 0.5, 1.1]])
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0, 1.0]])
    old = torch.zeros_like(ratio)
    out = ppo_clip_loss(ratio.log(), old, adv, clip_eps_low=0.2, clip_eps_high=0.28, dual_clip_c=3.0)
    # A>0, r=1.5: -min(1.5, 1.28) = -1.28 (clipped)      A>0, r=0.5: -0.5 (no clip below for A>0)
    # A<0, r=5:   max(5, 1.28) = 5, dual clip -> 3        A<0, r=0.5: max(0.5, 0.8) = 0.8 (clipped)
    # A>0, r=1.1: inside the band, -1.1
    assert out.loss.tolist()[0] == pytest.approx([-1.28, -0.5, 3.0, 0.8, -1.1], abs=1e-6)
    assert out.clipped.tolist()[0] == [True, False, False, True, False]  # at r=5, A<0 the unclipped term wins
    assert out.dual_clipped.tolist()[0] == [False, False, True, False, False]
    no_dual = ppo_clip_loss(ratio.log(), old, adv, clip_eps_low=0.2, clip_eps_high=0.28, dual_clip_c=None)
    assert no_dual.loss[0, 2].item() == pytest.approx(5.0)


def test_ppo_gradient_raises_logprob_of_positive_advantage_tokens():
    logp = torch.zeros(1, 2, requires_grad=True)
    out = ppo_clip_loss(logp, torch.zeros(1, 2), torch.tensor([[1.0, -1.0]]))
    out.loss.sum().backward()
    # Descending the loss raises log-prob where A > 0 and lowers it where A < 0.
    assert logp.grad[0, 0] < 0 < logp.grad[0, 1]


def test_kl_k3_by_hand():
    # pi = 0.5, ref = 0.25: d = log(0.5); k3 = 0.5 - log(0.5) - 1 = 0.19315
    val = kl_k3(torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)]))
    assert val.item() == pytest.approx(0.5 + math.log(2) - 1.0, abs=1e-6)
    assert kl_k3(torch.tensor([-1.0]), torch.tensor([-1.0])).item() == 0.0


def test_loss_aggregations_by_hand():
    v = torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0]])
    m = torch.tensor([[1, 1, 1], [1, 0, 0]])
    assert aggregate(v, m, "token_mean").item() == pytest.approx(10 / 4)
    assert aggregate(v, m, "seq_mean_token_mean").item() == pytest.approx((2 + 4) / 2)
    assert aggregate(v, m, "seq_mean_token_sum_norm", norm_len=4).item() == pytest.approx(10 / 8)
    # Micro-batch pieces with the whole mini-batch's counts sum to the mini-batch value.
    parts = [
        aggregate(v[i : i + 1], m[i : i + 1], "token_mean", num_tokens=4.0, num_seqs=2) for i in range(2)
    ]
    assert sum(parts).item() == pytest.approx(2.5)
    with pytest.raises(ValueError, match="unknown loss aggregation"):
        aggregate(v, m, "sum")


def test_truncated_is_weights():
    w, trunc = truncated_is_weights(
        torch.tensor([0.0, math.log(3.0)]), torch.tensor([math.log(2.0), 0.0]), 2.0
    )
    assert w.tolist() == pytest.approx([0.5, 2.0])
    assert trunc.tolist() == [False, True]


def test_log_ratio_is_clamped_so_a_pathological_old_logprob_gives_finite_loss_and_gradient():
    # old log-prob -1e4 (a token the behaviour policy "never" samples): exp(logp - old) overflows to inf
    # without the clamp; verl clamps the log-ratio to [-20, 20] before exp.
    logp = torch.tensor([[-1.0, -1.0]], requires_grad=True)
    old = torch.tensor([[-1e4, -1.0]])
    for adv in (torch.tensor([[1.0, 1.0]]), torch.tensor([[-1.0, -1.0]])):
        for dual in (None, 3.0):
            out = ppo_clip_loss(logp, old, adv, dual_clip_c=dual)
            assert torch.isfinite(out.loss).all() and torch.isfinite(out.ratio).all()
            assert float(out.ratio[0, 0].detach()) == pytest.approx(math.exp(20.0), rel=1e-5)
            (grad,) = torch.autograd.grad(out.loss.sum(), logp)
            assert torch.isfinite(grad).all(), (adv, dual)


def test_reinforce_pp_with_groups_of_one_uses_a_zero_baseline():
    # rollout.n = 1: each group is one response. The group mean would be the reward itself (A = 0, no
    # gradient); REINFORCE++ proper has no per-prompt baseline: whiten the raw rewards over the batch.
    r = torch.tensor([1.0, 0.0, 1.0, 0.0])
    g = group_indices(["a", "b", "c", "d"])
    s = math.sqrt(1 / 3)  # unbiased std of (1, 0, 1, 0)
    want = [0.5 / s, -0.5 / s, 0.5 / s, -0.5 / s]
    assert ADVANTAGES["reinforce_pp"](r, g, eps=0.0).tolist() == pytest.approx(want, abs=1e-6)
