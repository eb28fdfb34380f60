"""Micro-batches: which rows of a mini-batch go through one forward/backward together, and their layout.

Budget: a micro-batch costs ``rows x longest (prompt + response)`` tokens. ``plan_micro_batches``
packs rows greedily, in the order given, while that cost stays within
``trainer.max_tokens_per_micro_batch`` and the row count within ``trainer.micro_batch_size``; a single
row longer than the budget still gets its own micro-batch. The loss normalisers stay the whole
mini-batch's, so accumulated gradients equal the mini-batch gradient whatever the grouping.

Order (``trainer.micro_batch_order``, ``plan_rows``): ``length`` sorts the rows longest first before
cutting, so each micro-batch holds rows of similar length and pads little (SmolLM2 on the
``smollm2-arith-cpu`` batch: the padding FLOPs of a step 11% -> 5%, benchmarks/step_bound.py);
``shuffled`` cuts them in the mini-batch's shuffled order.

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

# Default token budget: the smaller of two bounds, clamped to 512..16,384 tokens.
# - The tokens whose float32 logits would fill 2 GiB at this vocabulary (3,533 at 151,936). The log-probs
#   themselves never hold more than one chunk of logits (rl_engine.models.logprobs); this bounds an output
#   layer that cannot be chunked (soft-capped logits).
# - The tokens whose saved activations would fill 2 GiB: what autograd keeps of a decoder layer per token
#   is at most 12 floats per hidden unit and 4 per MLP unit (measured with saved-tensor hooks on Llama and
#   Qwen2 layers: 11-12 and 3.7, the most where every head has its own keys and values;
#   tests/engine/test_microbatch_budget.py), 2 per hidden unit under gradient checkpointing (the layer's
#   input), and a few bytes of ids and positions per token. SmolLM2-135M (30 layers, 576 / 1,536): 1.57 MB a
#   token, 1,370 tokens — where the vocabulary bound alone (10,922) let one 32-row micro-batch hold 8.6 GB.
LOGITS_BUDGET_BYTES = 2 * 2**30
ACTIVATION_BUDGET_BYTES = 2 * 2**30
MIN_TOKENS, MAX_TOKENS = 512, 16384
FLOATS_PER_HIDDEN, FLOATS_PER_MLP, FLOATS_PER_HIDDEN_CHECKPOINTED = 12, 4, 2
BYTES_PER_TOKEN = 64  # token ids, positions, the causal mask's share: independent of the depth


@dataclass(frozen=True)
class ModelShape:
    """What sizes a micro-batch's memory: the vocabulary, and the decoder's depth and widths."""

    vocab_size: int
    num_layers: int | None = None
    hidden_size: int | None = None
    intermediate_size: int | None = None
    gradient_checkpointing: bool = False

    @classmethod
    def of(cls, config: object, vocab_size: int, gradient_checkpointing: bool) -> ModelShape:
        """From a transformers config (its ``text_config`` where it has one); missing sizes stay None."""
        text = getattr(config, "text_config", None) or config

        def size(name: str) -> int | None:
            value = getattr(text, name, None)
            return value if isinstance(value, int) and value > 0 else None

        return cls(vocab_size, size("num_hidden_layers"), size("hidden_size"), size("intermediate_size"),
                   gradient_checkpointing)  # fmt: skip

    def activation_bytes_per_token(self) -> int | None:
        """float32 bytes autograd saves per token across the decoder layers (an upper estimate)."""
        if self.num_layers is None or self.hidden_size is None:
            return None
        if self.gradient_checkpointing:
            floats = FLOATS_PER_HIDDEN_CHECKPOINTED * self.hidden_size
        else:
            floats = FLOATS_PER_HIDDEN * self.hidden_size + FLOATS_PER_MLP * (
                self.intermediate_size or 4 * self.hidden_size
            )
        return 4 * floats * self.num_layers + BYTES_PER_TOKEN


def default_token_budget(shape: ModelShape) -> int:
    tokens = LOGITS_BUDGET_BYTES // (4 * shape.vocab_size)
    per_token = shape.activation_bytes_per_token()
    if per_token:
        tokens = min(tokens, ACTIVATION_BUDGET_BYTES // per_token)
    return int(min(MAX_TOKENS, max(MIN_TOKENS, tokens)))


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


def plan_rows(
    prompt_lens: list[int], response_lens: list[int], max_rows: int, max_tokens: int, order: str = "length"
) -> list[list[int]]:
    """Positions 0..n-1 in micro-batches: ``plan_micro_batches`` on the rows in ``order`` (``length``:
    longest first, ties in the given order; ``shuffled``: as given). Each micro-batch lists its positions
    in ascending order."""
    n = len(prompt_lens)
    if order == "length":
        pos = sorted(range(n), key=lambda i: (-(prompt_lens[i] + response_lens[i]), i))
    elif order == "shuffled":
        pos = list(range(n))
    else:
        raise ValueError(f"micro-batch order {order!r}: length or shuffled")
    groups = plan_micro_batches(
        [prompt_lens[i] for i in pos], [response_lens[i] for i in pos], max_rows, max_tokens
    )
    return [sorted(pos[j] for j in g) for g in groups]


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
