"""Padding layout shared by the rollout worker and the trainer, so both compute the same log-probs.

Layout: prompts are LEFT-padded to a common length ``P`` and responses follow, RIGHT-padded to ``R``.
Positions come from the attention mask (``cumsum(mask) - 1``), so a token's position does not depend
on how much padding its batch needed — the rollout's KV-cache decode and the trainer's single forward
see identical positions.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """[B, T] 0/1 mask -> [B, T] positions: 0 at each row's first real token; pads clamp to 0."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def left_pad(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token lists -> (input_ids [B, L], attention_mask [B, L])."""
    width = max(len(s) for s in seqs)
    # One tensor construction from padded lists: much cheaper than a copy per row for small batches.
    ids = torch.tensor([[pad_id] * (width - len(s)) + list(s) for s in seqs], dtype=torch.long)
    mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in seqs], dtype=torch.long)
    return ids.reshape(len(seqs), width), mask.reshape(len(seqs), width)


def right_pad(
    rows: list[list[int]] | list[list[float]], value: float, dtype: torch.dtype, width: int | None = None
):
    """Right-pad lists to ``width`` (default: the longest) -> [B, width] tensor of ``dtype``."""
    width = max(1, max(len(r) for r in rows)) if width is None else width
    out = torch.tensor([list(r) + [value] * (width - len(r)) for r in rows], dtype=dtype)
    return out.reshape(len(rows), width)


@dataclass
class PackedBatch:
    """Prompt+response batch in the shared layout.

    input_ids, attention_mask, position_ids: [B, P + R]; response_mask: [B, R] (1 on real response
    tokens); prompt_len: P. The response token at column ``t`` of [B, R] sits at ``P + t`` in the full
    sequence and is predicted by the logits at ``P + t - 1``.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    response_mask: torch.Tensor
    prompt_len: int

    @property
    def response_ids(self) -> torch.Tensor:
        """[B, R]"""
        return self.input_ids[:, self.prompt_len :]

    def to(self, device: torch.device | str) -> PackedBatch:
        return PackedBatch(
            input_ids=self.input_ids.to(device),
            attention_mask=self.attention_mask.to(device),
            position_ids=self.position_ids.to(device),
            response_mask=self.response_mask.to(device),
            prompt_len=self.prompt_len,
        )


def pack(prompts: list[list[int]], responses: list[list[int]], pad_id: int) -> PackedBatch:
    """Build the shared layout from prompt and response token lists (same length lists)."""
    p_ids, p_mask = left_pad(prompts, pad_id)
    r_ids = right_pad(responses, pad_id, torch.long)
    r_mask = right_pad([[1] * len(r) for r in responses], 0, torch.long)
    mask = torch.cat([p_mask, r_mask], dim=1)
    return PackedBatch(
        input_ids=torch.cat([p_ids, r_ids], dim=1),
        attention_mask=mask,
        position_ids=position_ids_from_mask(mask),
        response_mask=r_mask,
        prompt_len=p_ids.shape[1],
    )


def token_logprobs_and_entropy(
    logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    with_entropy: bool = True,
    *,
    entropy_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob of ``targets`` under softmax(logits / temperature), and that distribution's entropy.

    logits: [..., V]; targets: [...] -> (logp [...], entropy [...] or None). Computed in float32.
    ``entropy_grad=False`` computes the entropy outside autograd (a metric only: saves a [..., V] buffer).
    This holds several [..., V] float32 tensors: the trainer uses it only for output layers that
    ``rl_engine.models.logprobs`` cannot chunk; it is also the reference the chunked path is tested against.
    """
    logp_all = torch.log_softmax(logits.float() / temperature, dim=-1)
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy
