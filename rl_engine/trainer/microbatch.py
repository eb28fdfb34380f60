"""Micro-batches: which rows of a mini-batch go through one forward/backward together, and their layout.

Budget: a micro-batch costs ``rows x longest (prompt + response)`` tokens. ``plan_micro_batches``
packs rows greedily, in the (shuffled) mini-batch order, while that cost stays within
``trainer.max_tokens_per_micro_batch`` and the row count within ``trainer.micro_batch_size``; a single
row longer than the budget still gets its own micro-batch. The loss normalisers stay the whole
mini-batch's, so accumulated gradients equal the mini-batch gradient.

Layout: ``select`` takes rows of the shared left-padded batch (``rl_engine.models.batching``) and
left-aligns each one (its prompt, then its response, then padding). Under causal attention a token
only sees the tokens before it, so right padding cannot change a real token's output: the forward
needs no attention mask, and SDPA runs its causal kernels instead of materialising a
``[rows, heads, L, L]`` masked score matrix (33 MB per 1,024-token row and layer on CPU). Positions
are ``0 .. len - 1`` per row, exactly those of the padded layout, so log-probs are unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rl_engine.models.batching import PackedBatch

# Default token budget: the tokens whose float32 logits would fill 2 GiB at this vocabulary (3,533 at
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
    longest = 0
    for i, (p, r) in enumerate(zip(prompt_lens, response_lens, strict=True)):
        if rows and (len(rows) >= max_rows or (len(rows) + 1) * max(longest, p + r) > max_tokens):
            groups.append(rows)
            rows, longest = [], 0
        rows.append(i)
        longest = max(longest, p + r)
    if rows:
        groups.append(rows)
    return groups


@dataclass
class MicroBatch:
    """Rows of a step's batch, left-aligned for a causal forward without an attention mask.

    input_ids, position_ids: [b, L], each row its prompt, its response, then padding. One entry per
    real response token in rows, cols, targets, tcols [N]: the hidden state at (rows, cols) predicts
    ``targets``, which is column ``tcols`` of the step's [B, R] response layout. width: the longest
    response of these rows (per-token tensors of the step are sliced to ``[:, :width]``).
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    rows: torch.Tensor
    cols: torch.Tensor
    targets: torch.Tensor
    tcols: torch.Tensor
    width: int

    @property
    def shape(self) -> tuple[int, int]:
        """[b, width]: the response layout of these rows."""
        return self.input_ids.shape[0], self.width


def select(batch: PackedBatch, idx: torch.Tensor, pad_id: int) -> MicroBatch:
    """Rows ``idx`` of ``batch`` as a ``MicroBatch`` (see the module docstring)."""
    ids, mask, resp = batch.input_ids[idx], batch.attention_mask[idx], batch.response_mask[idx]
    p_len = mask[:, : batch.prompt_len].sum(1)  # [b] real prompt tokens
    r_len = resp.sum(1)
    lead = batch.prompt_len - p_len  # left padding of each row
    length = int((p_len + r_len).max())
    col = torch.arange(length, device=ids.device)
    src = (col[None, :] + lead[:, None]).clamp(max=ids.shape[1] - 1)
    real = col[None, :] < (p_len + r_len)[:, None]
    aligned = torch.where(real, ids.gather(1, src), torch.full_like(src, pad_id))
    rows, tcols = resp.nonzero(as_tuple=True)  # real response tokens, row-major
    cols = p_len[rows] + tcols - 1  # the position that predicts response token t of row i
    return MicroBatch(
        input_ids=aligned,
        position_ids=col[None, :].expand(len(idx), -1),
        rows=rows,
        cols=cols,
        targets=aligned[rows, cols + 1],
        tcols=tcols,
        width=max(1, int(r_len.max())),
    )
