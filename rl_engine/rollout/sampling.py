"""Per-step token sampling of the HF decode loop on preallocated buffers: no vocabulary-sized tensor is
made and dropped per step.

One decode step turns the last position's logits [B, V] into one sampled token and its log-prob per
row: logits / temperature, log-softmax, exp, (top-p: sort, cumulative sum, mask, scatter back), a
multinomial draw. Written naively each of those allocates a [B, V] float32 tensor (9.7 MB at B = 16
and a 151,936 vocabulary), and so does the model's output layer, and frees it a moment later: in a Ray
actor's decoding thread glibc's heap then grew step after step (rl_engine.rollout.heap has why and the
allocator setting that keeps it flat). ``DecodeSampler`` owns the [B, V] buffers of a micro-batch shape,
the one the decode loop writes the logits into included, and does every step in place, with exactly the
same numerics: the same ops in the same order, and the draw is ``torch.multinomial``'s own single-sample
algorithm (``q ~ Exp(1)``, ``argmax(p / q)``) with the same generator calls, so a fixed seed gives the
same tokens and log-probs as the allocating version.
"""

from __future__ import annotations

import torch


class DecodeSampler:
    """Buffers for ``rows`` x ``vocab`` logits on ``device``; ``step`` samples one token per row.

    ``logits``: a [rows, vocab] buffer of ``logits_dtype`` the decode loop writes each step's logits into
    (the output layer's ``out=``); with float32 logits it is the work buffer itself, which ``step``
    overwrites. Memory: three [rows, vocab] float32 buffers (four with other logits dtypes), plus
    (``top_p < 1``) a float32, an int64 and a bool one for the sorted nucleus. Reused for every step and
    every micro-batch of the same shape.
    """

    def __init__(
        self,
        rows: int,
        vocab: int,
        device: torch.device,
        top_p: float,
        logits_dtype: torch.dtype = torch.float32,
    ) -> None:
        self.shape, self.device, self.top_p = (rows, vocab), torch.device(device), top_p
        self.logits_dtype = logits_dtype
        f32 = {"dtype": torch.float32, "device": self.device}
        self._work = torch.empty(rows, vocab, **f32)  # logits / T, then the probabilities
        self._logp = torch.empty(rows, vocab, **f32)
        self._aux = torch.empty(rows, vocab, **f32)  # the nucleus' cumulative mass, then the Exp(1) noise
        self.logits = (
            self._work
            if logits_dtype == torch.float32
            else torch.empty(rows, vocab, dtype=logits_dtype, device=self.device)
        )
        if top_p < 1.0:
            self._sorted = torch.empty(rows, vocab, **f32)
            self._order = torch.empty(rows, vocab, dtype=torch.long, device=self.device)
            self._drop = torch.empty(rows, vocab, dtype=torch.bool, device=self.device)

    def fits(
        self,
        rows: int,
        vocab: int,
        device: torch.device,
        top_p: float,
        logits_dtype: torch.dtype = torch.float32,
    ) -> bool:
        return (
            self.shape == (rows, vocab)
            and self.device == torch.device(device)
            and self.top_p == top_p
            and self.logits_dtype == logits_dtype
        )

    @torch.no_grad()
    def step(
        self, logits: torch.Tensor, temperature: float, generator: torch.Generator | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """logits [rows, vocab] (any float dtype) -> (tokens [rows] int64, their log-probs [rows]
        float32 under softmax(logits / temperature), before any top-p cut)."""
        work, logp = self._work, self._logp
        if logits is not work:  # (float32 logits written into ``self.logits`` are already there)
            work.copy_(logits)  # == logits.float()
        work.div_(temperature)
        torch.log_softmax(work, dim=-1, out=logp)
        probs = torch.exp(logp, out=work)
        if self.top_p < 1.0:
            self._nucleus(probs)
        tok = self._draw(probs, generator)
        return tok, logp.gather(-1, tok[:, None]).squeeze(-1)

    def _nucleus(self, probs: torch.Tensor) -> None:
        """Zero, in place, every token outside the nucleus of mass ``top_p`` (the top token stays)."""
        srt, order, cum, drop = self._sorted, self._order, self._aux, self._drop
        torch.sort(probs, dim=-1, descending=True, out=(srt, order))
        # drop a token when the mass before it already reaches top_p
        torch.cumsum(srt, dim=-1, out=cum)
        cum.sub_(srt)
        torch.ge(cum, self.top_p, out=drop)
        srt.masked_fill_(drop, 0.0)
        probs.zero_().scatter_(-1, order, srt)

    def _draw(self, probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
        """One token per row from the unnormalised ``probs``: ``torch.multinomial(probs, 1)`` without
        its temporary [rows, vocab] tensor (the same draw from the same generator state)."""
        total = probs.sum(-1)
        if not bool((torch.isfinite(total) & (total > 0)).all()):
            raise RuntimeError("sampling: probability tensor contains either inf, nan or element < 0")
        noise = self._aux.exponential_(1.0, generator=generator)
        torch.div(probs, noise, out=noise)
        return noise.argmax(dim=-1)


__all__ = ["DecodeSampler"]
