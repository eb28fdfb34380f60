"""Log-probs of the taken tokens and the entropy, computed through the output layer in token chunks.

At a 150k vocabulary the ``[tokens, vocab]`` float32 logits of one micro-batch are gigabytes (1,024
tokens: 622 MB per tensor, and a plain log-softmax + entropy keeps several). ``ChunkedHeadLogProbs``
takes the final hidden states instead and runs the output projection ``chunk`` tokens at a time:
the forward keeps only per-token results (log-prob, log-sum-exp, entropy), and the backward
recomputes each chunk's logits and writes the gradient of the hidden states and of the projection
directly, so neither pass ever holds more than one chunk's ``[chunk, vocab]`` buffers (two of them).
verl's ``FusedLinearForPPO`` does the same; this is the CPU/GPU-agnostic torch version.

Values equal ``batching.token_logprobs_and_entropy`` on the full logits (tested to 1e-5, gradients too).
Logits are formed in the autocast dtype when autocast is on (as the rollout forms them from its bf16
weights), then handled in float32; the backward's matmuls run in float32 on the float32 master weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Default chunk: 32 MiB of float32 logits (55 tokens at a 151,936 vocabulary; the whole micro-batch at
# the tiny model's 54). ``trainer.logits_chunk_tokens`` overrides it.
CHUNK_LOGITS_BYTES = 32 * 2**20
# Config attributes that make an output layer more than ``hidden @ W.T + b`` (soft-capping, scaling):
# such models take the full-logits path.
_NON_LINEAR_HEAD_ATTRS = (
    "final_logit_softcapping",
    "logit_scale",
    "logits_scaling",
    "output_multiplier_scale",
)


def default_chunk_tokens(vocab_size: int) -> int:
    return max(16, CHUNK_LOGITS_BYTES // (4 * vocab_size))


@dataclass(frozen=True)
class LinearHead:
    """The output layer as a plain projection: logits = hidden @ weight.T + bias. weight [V, H], bias [V]."""

    weight: torch.Tensor
    bias: torch.Tensor | None


def linear_head_of(model: torch.nn.Module) -> LinearHead | None:
    """The model's output layer if it is a plain ``nn.Linear`` with nothing applied after it, else None."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if type(head) is not torch.nn.Linear:
        return None
    config = getattr(model, "config", None)
    for attr in _NON_LINEAR_HEAD_ATTRS:
        if getattr(config, attr, None) not in (None, 1, 1.0):
            return None
    return LinearHead(head.weight, head.bias)


def _logits(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, temperature: float) -> torch.Tensor:
    """[c, H] x [V, H] -> float32 [c, V] logits / temperature (matmul in the dtype of ``w``)."""
    z = torch.nn.functional.linear(h.to(w.dtype), w, b).float()
    return z.div_(temperature) if temperature != 1.0 else z


class ChunkedHeadLogProbs(torch.autograd.Function):
    """(hidden [N, H], weight [V, H], bias [V] | None, targets [N]) -> (logp [N], entropy [N]), float32.

    ``compute_dtype`` is the dtype the logits are formed in (the autocast dtype, or the weight's).
    ``entropy_grad=False`` makes the entropy a metric only (no gradient flows through it).
    """

    @staticmethod
    def forward(
        ctx, hidden, weight, bias, targets, temperature, chunk, compute_dtype, with_entropy, entropy_grad
    ):
        w = weight.to(compute_dtype)  # one cast for all chunks (a no-op in float32)
        b = bias.to(compute_dtype) if bias is not None else None
        n = hidden.shape[0]
        logp = torch.empty(n, dtype=torch.float32, device=hidden.device)
        lse = torch.empty_like(logp)
        entropy = torch.empty_like(logp)
        with torch.autocast(hidden.device.type, enabled=False):
            for s in range(0, n, chunk):
                z = _logits(hidden[s : s + chunk], w, b, temperature)
                lse_c = torch.logsumexp(z, dim=-1)
                z.sub_(lse_c[:, None])  # z is log p now
                logp[s : s + chunk] = z.gather(1, targets[s : s + chunk, None]).squeeze(1)
                lse[s : s + chunk] = lse_c
                if with_entropy:
                    entropy[s : s + chunk] = -(z.exp().mul_(z)).sum(-1)
                else:
                    entropy[s : s + chunk] = 0.0
        ctx.save_for_backward(hidden, weight, bias, targets, lse, entropy)
        ctx.conf = (temperature, chunk, compute_dtype)
        ctx.set_materialize_grads(False)  # an output nobody differentiates comes back as None
        if not (with_entropy and entropy_grad):
            ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx, g_logp, g_entropy):
        hidden, weight, bias, targets, lse, entropy = ctx.saved_tensors
        temperature, chunk, compute_dtype = ctx.conf
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        w = weight.to(compute_dtype)
        b = bias.to(compute_dtype) if bias is not None else None
        w32 = weight.float()  # the backward's matmuls run in float32 (a no-op on float32 master weights)
        grad_h = torch.empty(hidden.shape, dtype=torch.float32, device=hidden.device) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        grad_b = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if need_b else None
        rows = torch.arange(min(chunk, hidden.shape[0]), device=hidden.device)
        with torch.autocast(hidden.device.type, enabled=False):
            for s in range(0, hidden.shape[0], chunk):
                h = hidden[s : s + chunk]
                c = h.shape[0]
                z = _logits(h, w, b, temperature).sub_(lse[s : s + chunk, None])  # log p, as in forward
                p = z.exp()
                # d logp_t / dz = onehot_t - p;  d entropy / dz = -p (log p + entropy)
                if g_entropy is not None:
                    z.add_(entropy[s : s + chunk, None]).mul_(p).mul_(-g_entropy[s : s + chunk, None])
                else:
                    z.zero_()
                if g_logp is not None:
                    gl = g_logp[s : s + chunk]
                    z.sub_(p.mul_(gl[:, None]))
                    z[rows[:c], targets[s : s + chunk]] += gl
                z.div_(temperature)  # through logits / T: z is d loss / d logits now
                if need_h:
                    grad_h[s : s + chunk] = z @ w32
                if need_w:
                    grad_w.addmm_(z.T, h.float())
                if need_b:
                    grad_b += z.sum(0)
        grad_h = grad_h.to(hidden.dtype) if need_h else None
        grad_w = grad_w.to(weight.dtype) if need_w else None
        grad_b = grad_b.to(bias.dtype) if need_b else None
        return grad_h, grad_w, grad_b, None, None, None, None, None, None


def chunked_logprobs_and_entropy(
    hidden: torch.Tensor,
    head: LinearHead,
    targets: torch.Tensor,
    temperature: float,
    *,
    chunk_tokens: int,
    with_entropy: bool = True,
    entropy_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob of ``targets`` under softmax(head(hidden) / T) and that distribution's entropy.

    hidden [N, H], targets [N] -> (logp [N], entropy [N]), float32; at most ``chunk_tokens`` rows of
    logits exist at any time, forward or backward. Under autocast the logits are formed in its dtype.
    ``with_entropy=False`` skips the entropy (returned as zeros); ``entropy_grad=False`` makes it a
    metric only (no gradient through it).
    """
    dev = hidden.device.type
    compute_dtype = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else head.weight.dtype
    return ChunkedHeadLogProbs.apply(
        hidden,
        head.weight,
        head.bias,
        targets,
        float(temperature),
        max(1, int(chunk_tokens)),
        compute_dtype,
        bool(with_entropy),
        bool(entropy_grad and torch.is_grad_enabled()),
    )


__all__ = [
    "CHUNK_LOGITS_BYTES",
    "ChunkedHeadLogProbs",
    "LinearHead",
    "chunked_logprobs_and_entropy",
    "default_chunk_tokens",
    "linear_head_of",
]
