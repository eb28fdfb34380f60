"""``PolicyForward``: the trainer's forward (response-token log-probs and entropy) as one module.

It is a module so that FSDP2 can shard it at the root: the root's parameters (embeddings, final norm,
output layer) are gathered by the root's forward hooks, so the output layer's weight read here is the
whole weight during ``forward`` on every rank, sharded or not. The output layer runs in token chunks
(``rl_engine.models.logprobs``) unless it is not a plain projection (soft-capped logits).
"""

from __future__ import annotations

import torch

from rl_engine.models.batching import token_logprobs_and_entropy
from rl_engine.models.logprobs import LinearHead, chunked_logprobs_and_entropy, linear_head_of


class PolicyForward(torch.nn.Module):
    """Wraps a causal LM; ``forward`` -> (log-probs [N], entropy [N]) of the N real response tokens."""

    def __init__(self, model: torch.nn.Module, temperature: float, chunk_tokens: int) -> None:
        super().__init__()
        self.lm = model
        self.temperature, self.chunk_tokens = temperature, chunk_tokens
        # looked up once (HF walks its modules to find them); the weights are read at each call, since a
        # sharded root swaps its parameters between the shards and the gathered tensors
        self._linear = linear_head_of(model) is not None
        self._head_module = model.get_output_embeddings() if self._linear else None
        self._body = model.get_decoder() if self._linear else None

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        rows: torch.Tensor,
        cols: torch.Tensor,
        targets: torch.Tensor,
        with_entropy: bool,
        entropy_grad: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """input_ids, position_ids [b, L]; rows, cols, targets [N] -> (logp [N], entropy [N]) float32."""
        inputs = {"input_ids": input_ids, "position_ids": position_ids, "use_cache": False}
        if not self._linear:  # this micro-batch's full logits
            logits = self.lm(**inputs).logits[rows, cols]
            return token_logprobs_and_entropy(logits, targets, self.temperature, entropy_grad=entropy_grad)
        hidden = self._body(**inputs).last_hidden_state
        head = LinearHead(self._head_module.weight, self._head_module.bias)
        return chunked_logprobs_and_entropy(
            hidden[rows, cols],
            head,
            targets,
            self.temperature,
            chunk_tokens=self.chunk_tokens,
            with_entropy=with_entropy,
            entropy_grad=entropy_grad,
        )
