"""Token-level policy-gradient losses, KL, off-policy weights and loss aggregation. Pure tensor functions.

Shapes: every per-token tensor is [B, T] (B responses, T response tokens, right-padded); ``mask`` is
[B, T] with 1 on real tokens. Log-probs are of logits / temperature everywhere.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

# The log-ratio logp - old_logp is clamped to this range before exp (as verl does): a pathological old
# log-prob (e.g. -1e4 for a token the behaviour policy "never" samples) would otherwise overflow the
# ratio to inf, and inf * 0 in the backward of the clip turns every gradient into NaN.
LOG_RATIO_CLAMP = 20.0


@dataclass
class PolicyLossOut:
    """Per-token surrogate loss and which tokens were clipped, all [B, T]."""

    loss: torch.Tensor
    clipped: torch.Tensor  # the ratio clip was active (the gradient of that token is zero)
    dual_clipped: torch.Tensor  # the dual clip bound -c*A was active (negative advantages only)
    ratio: torch.Tensor


def ppo_clip_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    *,
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.2,
    dual_clip_c: float | None = None,
) -> PolicyLossOut:
    """PPO clipped surrogate with asymmetric clip and optional dual clip, per token.

    r = exp(clamp(logp - old_logp, -20, 20)); L = -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A);
    for A < 0 with dual clip: L = min(L, -c A) (caps the loss when r is far above 1).
    logp, old_logp, advantages: [B, T] -> PolicyLossOut of [B, T] tensors.
    """
    ratio = torch.exp((logp - old_logp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_eps_low, 1.0 + clip_eps_high)
    loss = torch.maximum(unclipped, clipped)
    was_clipped = clipped > unclipped
    dual = torch.zeros_like(was_clipped)
    if dual_clip_c is not None:
        bound = -advantages * dual_clip_c
        dual = (advantages < 0) & (loss > bound)
        loss = torch.where(dual, bound, loss)
    return PolicyLossOut(loss=loss, clipped=was_clipped, dual_clipped=dual, ratio=ratio)


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(pi || ref) per token: exp(ref - logp) - (ref - logp) - 1 >= 0. [B, T]."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1.0


def truncated_is_weights(
    target_logp: torch.Tensor, behaviour_logp: torch.Tensor, threshold: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Truncated importance weights w = min(exp(target - behaviour), threshold), no gradient.

    target_logp, behaviour_logp: [B, T] -> (weights [B, T], truncated [B, T] bool).
    """
    raw = torch.exp((target_logp - behaviour_logp).detach())
    return raw.clamp(max=threshold), raw > threshold


def filtered_is_weights(
    target_logp: torch.Tensor, behaviour_logp: torch.Tensor, cap: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decoupled-PPO behaviour weights (AReaL's ``behav_imp_weight_cap``): w = exp(target - behaviour)
    where it is at most ``cap``; tokens above the cap are filtered out of the loss (w = 0), not truncated.

    target_logp, behaviour_logp: [B, T] -> (weights [B, T], filtered [B, T] bool), no gradient.
    """
    raw = torch.exp((target_logp - behaviour_logp).detach())
    over = raw > cap
    return raw.masked_fill(over, 0.0), over


ImportanceWeights = Callable[[torch.Tensor, torch.Tensor, float], tuple[torch.Tensor, torch.Tensor]]
# The registry of ``algorithm.off_policy`` (its names: rl_engine.config.names.OFF_POLICY): how the
# behaviour log-probs weigh each token against the recomputed ones; none: the behaviour log-probs are the
# old log-probs, no weights.
OFF_POLICY_WEIGHTS: dict[str, ImportanceWeights | None] = {
    "none": None,
    "tis": truncated_is_weights,
    "decoupled": filtered_is_weights,
}


@dataclass(frozen=True)
class Counts:
    """What a reduction divides by: the whole mini-batch's sequences and tokens when the values are one
    micro-batch of it (so that gradient accumulation sums to the mini-batch loss), and the constant
    length of ``seq_mean_token_sum_norm``."""

    num_seqs: int
    num_tokens: float | None  # None: the mask's (counted only where a reduction needs it)
    norm_len: float


def token_mean(values: torch.Tensor, m: torch.Tensor, counts: Counts) -> torch.Tensor:
    """sum(v m) / num_tokens: every token weighs the same (DAPO)."""
    tokens = m.sum() if counts.num_tokens is None else counts.num_tokens
    return (values * m).sum() / max(float(tokens), 1.0)


def seq_mean_token_mean(values: torch.Tensor, m: torch.Tensor, counts: Counts) -> torch.Tensor:
    """The mean over sequences of each sequence's token mean (the GRPO paper)."""
    per_seq = (values * m).sum(-1) / m.sum(-1).clamp(min=1.0)
    return per_seq.sum() / max(counts.num_seqs, 1)


def seq_mean_token_sum_norm(values: torch.Tensor, m: torch.Tensor, counts: Counts) -> torch.Tensor:
    """sum(v m) / (num_seqs * norm_len): a constant normaliser (Dr.GRPO)."""
    return (values * m).sum() / (max(counts.num_seqs, 1) * counts.norm_len)


# The registry of ``algorithm.loss_agg`` (its names: rl_engine.config.names.LOSS_AGGREGATIONS).
AGGREGATIONS: dict[str, Callable[[torch.Tensor, torch.Tensor, Counts], torch.Tensor]] = {
    "token_mean": token_mean,
    "seq_mean_token_mean": seq_mean_token_mean,
    "seq_mean_token_sum_norm": seq_mean_token_sum_norm,
}


def aggregate(
    values: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    *,
    num_seqs: int | None = None,
    num_tokens: float | None = None,
    norm_len: float | None = None,
) -> torch.Tensor:
    """Reduce per-token values [B, T] to a scalar by the aggregation ``mode`` names (:data:`AGGREGATIONS`).
    ``num_seqs``/``num_tokens`` default to this tensor's; pass the whole mini-batch's counts when
    ``values`` is one micro-batch of it, so gradient accumulation sums to the mini-batch loss.
    ``norm_len`` defaults to T.
    """
    if mode not in AGGREGATIONS:
        raise ValueError(f"unknown loss aggregation {mode!r}; choose one of {', '.join(AGGREGATIONS)}")
    m = mask.to(values.dtype)
    counts = Counts(
        num_seqs=values.shape[0] if num_seqs is None else num_seqs,
        num_tokens=num_tokens,
        norm_len=values.shape[1] if norm_len is None else norm_len,
    )
    return AGGREGATIONS[mode](values, m, counts)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of values over mask == 1 (0 when the mask is empty). [B, T] -> scalar."""
    m = mask.to(values.dtype)
    return (values * m).sum() / m.sum().clamp(min=1.0)
