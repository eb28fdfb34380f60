"""Micro-batches by token budget: which rows of a mini-batch go through one forward/backward together.

A micro-batch costs ``rows x (widest prompt + longest response)`` padded tokens once trimmed to its own
rows (``trim``). ``plan_micro_batches`` packs rows greedily, in the (shuffled) mini-batch order, while
that cost stays within ``trainer.max_tokens_per_micro_batch`` and the row count within
``trainer.micro_batch_size``; a single row longer than the budget still gets its own micro-batch. The
loss normalisers stay the whole mini-batch's, so accumulated gradients equal the mini-batch gradient.
"""

from __future__ import annotations

import torch

from rl_engine.models.batching import PackedBatch

# Default token budget: the tokens whose float32 logits would fill 2 GiB at this vocabulary (3,532 at
# 151,936), clamped to 512..16,384. The log-probs themselves never hold more than one chunk of logits
# (rl_engine.models.logprobs); this bounds a micro-batch's activations and, for an output layer that
# cannot be chunked (soft-capped logits), its full logits.
LOGITS_BUDGET_BYTES = 2 * 2**30
MIN_TOKENS, MAX_TOKENS = 512, 16384


def default_token_budget(vocab_size: int) -> int:
    return int(min(MAX_TOKENS, max(MIN_TOKENS, LOGITS_BUDGET_BYTES // (4 * vocab_size))))


def row_lengths(batch: PackedBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """(real prompt tokens [B], real response tokens [B]) of each row."""
    prompt = batch.attention_mask[:, : batch.prompt_len].sum(1)
    return prompt, batch.response_mask.sum(1)


def plan_micro_batches(
    prompt_lens: list[int], response_lens: list[int], max_rows: int, max_tokens: int
) -> list[list[int]]:
    """Positions 0..n-1 grouped into consecutive micro-batches (see the module docstring)."""
    groups: list[list[int]] = []
    rows: list[int] = []
    p_max = r_max = 0
    for i, (p, r) in enumerate(zip(prompt_lens, response_lens, strict=True)):
        cost = (len(rows) + 1) * (max(p_max, p) + max(r_max, r))
        if rows and (len(rows) >= max_rows or cost > max_tokens):
            groups.append(rows)
            rows, p_max, r_max = [], 0, 0
        rows.append(i)
        p_max, r_max = max(p_max, p), max(r_max, r)
    if rows:
        groups.append(rows)
    return groups


def select(batch: PackedBatch, idx: torch.Tensor) -> tuple[PackedBatch, int]:
    """Rows ``idx`` of ``batch`` trimmed to their own padding -> (batch, response width R').

    Leading all-padding prompt columns and trailing all-padding response columns are dropped; a
    token's position does not depend on its batch's padding (positions come from the mask), so its
    log-prob is unchanged. Per-token [B, R] tensors of the step are sliced to ``[:, :R']`` to match.
    """
    mask = batch.attention_mask[idx]
    width = max(1, int(batch.response_mask[idx].sum(1).max()))
    lead = int((mask[:, : batch.prompt_len].sum(0) == 0).sum()) if batch.prompt_len else 0
    lead = min(lead, batch.prompt_len - 1) if batch.prompt_len else 0  # keep one column to predict from
    cols = slice(lead, batch.prompt_len + width)
    return (
        PackedBatch(
            input_ids=batch.input_ids[idx][:, cols],
            attention_mask=mask[:, cols],
            position_ids=batch.position_ids[idx][:, cols],
            response_mask=batch.response_mask[idx][:, :width],
            prompt_len=batch.prompt_len - lead,
        ),
        width,
    )
