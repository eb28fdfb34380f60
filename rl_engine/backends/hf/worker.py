"""HF transformers rollout worker: batched sampling with its own KV-cache decode loop.

Why not ``model.generate``: the loop must (1) record the log-prob of each sampled token under exactly
the distribution sampled from (logits / temperature), (2) stop at a chunk boundary when another thread
calls ``interrupt()`` and hand back the partial responses, and (3) continue them later from
prompt + prefix. The loop is the same work ``generate`` does per step (one cached forward, one
multinomial draw); ``benchmarks/engine_core.py`` measures it against bare ``generate``.
"""

from __future__ import annotations

import inspect
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from rl_engine.backends.hf.weights import HFWeights
from rl_engine.config import HFRolloutConfig, ModelConfig
from rl_engine.config.lora import sync_mode
from rl_engine.models import load_model, load_tokenizer, resolve_device, special_token_ids
from rl_engine.models.batching import left_pad, position_ids_from_mask
from rl_engine.models.logprobs import linear_head_of
from rl_engine.models.lora import adapter_parameters, add_adapters
from rl_engine.rollout.common import (
    call_budget,
    eos_floor,
    extend_sample,
    needs_continuation,
    sample_template,
)
from rl_engine.rollout.sampling import DecodeSampler
from rl_engine.types import FinishReason, Prompt, Sample
from rl_engine.weights.buckets import FlatParams


@dataclass
class _Request:
    """One response to produce: the prompt, the tokens already generated (for resume), and its sample."""

    prompt_ids: list[int]
    prefix_ids: list[int]
    budget: int  # new tokens still allowed
    template: Sample
    eos_floor: int = 0  # new tokens during which eos is masked out (RolloutWorker.min_new_tokens)
    new_ids: list[int] = field(default_factory=list)
    new_logprobs: list[float] = field(default_factory=list)
    finish: FinishReason = "abort"
    elapsed_s: float = 0.0
    version: int | None = None  # policy version of the weights that decoded it (None: never started)


def _cache_of(out: Any) -> Any:
    """The KV cache of a forward's output (``cache`` in transformers 5.2x, ``past_key_values`` before)."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


def _mask_eos(logits: torch.Tensor, eos: torch.Tensor, rows: torch.Tensor) -> None:
    """Make the ``eos`` columns of ``logits`` [B, V] -inf, in place, on the ``rows`` (bool [B]) that
    may not end yet: they are out of the sampling distribution there, as in vLLM's ``min_tokens``."""
    logits[:, eos] = logits[:, eos].masked_fill(rows[:, None], float("-inf"))


class HFRolloutWorker(HFWeights):
    """Rollout on a local transformers model, on ``rollout.device`` (``auto``: cuda when ``gpus`` >= 1).

    Behaviour log-probs are of logits / temperature (no top-p renormalisation: with ``top_p < 1`` they
    are the log-probs of the temperature-scaled distribution the nucleus was cut from, matching what the
    trainer recomputes). Weights are served in ``model.dtype``; a sync arrives through ``HFWeights``
    (``rl_engine.backends.hf.weights``): a ``WeightStream`` in ``update_weights`` (in process, object
    store) or by broadcast (``init_weight_transfer`` once, then ``receive_weights``).
    """

    def __init__(
        self,
        rollout_cfg: HFRolloutConfig,
        model_cfg: ModelConfig,
        *,
        seed: int = 0,
        device: str | None = None,
        gpus: int = 0,
    ):
        super().__init__()
        self.cfg = rollout_cfg
        torch.set_num_threads(rollout_cfg.num_threads)
        device = device or resolve_device(rollout_cfg.device, gpus, "rollout")
        # Loaded on the CPU, then moved parameter by parameter into one contiguous buffer on ``device``:
        # a weight sync from the trainer lands bucket by bucket in slices of it (rl_engine.weights.buckets),
        # and the device never holds the model twice. None for mixed dtypes (then piece by piece).
        self.model = load_model(model_cfg, device="cpu").eval()
        self._flat = FlatParams.of(self.model, device)
        self.model.to(device)  # buffers (and the parameters when there is no flat buffer)
        self.tokenizer = load_tokenizer(model_cfg)
        self.special = special_token_ids(model_cfg, self.tokenizer)
        self.device = torch.device(device)
        self._eos = torch.tensor(self.special.eos_ids, dtype=torch.long, device=self.device)
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self._params = dict(self.model.named_parameters())
        # transformers 5.2x names the KV cache ``cache``; earlier releases ``past_key_values``
        self._cache_kwarg = (
            "cache" if "cache" in inspect.signature(self.model.forward).parameters else "past_key_values"
        )
        self._weights_lock = threading.Lock()
        self._group: Any = None  # the broadcast weight group (init_weight_transfer), if any
        self._group_device = self.device
        self._sampler: DecodeSampler | None = None  # per-step sampling buffers (rl_engine.rollout.sampling)
        # A plain output layer is applied here, into the sampler's logits buffer, after the model's body:
        # no [B, V] tensor per decode step. None (soft-capped or scaled logits): the model's own forward.
        # (Modules looked up once; their weights are read at each step.)
        plain_head = linear_head_of(self.model) is not None
        self._body = self.model.get_decoder() if plain_head else None
        self._head = self.model.get_output_embeddings() if plain_head else None
        if sync_mode(model_cfg.lora, "hf") == "adapters":
            # The trainer's adapters on these frozen weights, under the trainer's names (peft injects
            # them into the modules above in place): a sync sends and loads the adapters only. (A merged
            # sync sends every weight under the base model's names: the plain model takes it as it is.)
            self.model = add_adapters(self.model, model_cfg.lora, seed).eval()
            self._params = adapter_parameters(self.model)
            self._flat = None  # the adapters load piece by piece (they are small)

    # --- public API -------------------------------------------------------------------------------
    def generate(self, prompts: list[Prompt], n: int) -> list[Sample]:
        budget = min(self.cfg.max_new_tokens, self.max_turn_tokens or self.cfg.max_new_tokens)
        floor = eos_floor(self.min_new_tokens, 0, budget)
        reqs = [
            _Request(list(p.token_ids), [], budget, sample_template(p, self.version), floor)
            for p in prompts
            for _ in range(n)
        ]
        return self._run(reqs)

    def resume(self, samples: list[Sample]) -> list[Sample]:
        reqs: list[_Request | None] = []
        for s in samples:
            if not needs_continuation(s, self.cfg.max_new_tokens, self.max_turn_tokens):
                reqs.append(None)  # finished (or out of budget): passes through unchanged
                continue
            budget = call_budget(s, self.cfg.max_new_tokens, self.max_turn_tokens)
            floor = eos_floor(self.min_new_tokens, len(s.response_ids), budget)
            reqs.append(_Request(list(s.prompt_ids), list(s.response_ids), budget, s, floor))
        todo = [r for r in reqs if r is not None]
        done = iter(self._run(todo))
        return [next(done) if r is not None else s for r, s in zip(reqs, samples, strict=True)]

    def sampler_state(self) -> bytes:
        """The sampling generator's state (``torch.Generator.get_state``; its CPU bytes on any device)."""
        with self._weights_lock:  # not while a micro-batch draws from it
            return bytes(self.generator.get_state().numpy().tobytes())

    def load_sampler_state(self, state: bytes) -> None:
        with self._weights_lock:
            self.generator.set_state(torch.frombuffer(bytearray(state), dtype=torch.uint8))

    # --- internals --------------------------------------------------------------------------------
    def _run(self, reqs: list[_Request]) -> list[Sample]:
        mb = self.cfg.micro_batch_size
        for start in range(0, len(reqs), mb):
            chunk = reqs[start : start + mb]
            if self.interrupted:
                continue  # not started: comes back as an abort with its prefix unchanged
            # The lock keeps a concurrent update_weights from swapping weights mid-micro-batch; the
            # version is read under it, so each token is attributed to the weights that produced it.
            with self._weights_lock:
                version = self._version
                t0 = time.perf_counter()
                self._decode(chunk)
                dt = time.perf_counter() - t0
            for r in chunk:
                r.elapsed_s, r.version = dt, version
        return [self._to_sample(r) for r in reqs]

    def _to_sample(self, r: _Request) -> Sample:
        tmpl = r.template
        if r.version is not None and not tmpl.response_ids and tmpl.num_interruptions == 0:
            # A fresh response starts on the weights its first token was sampled with.
            tmpl = replace(tmpl, param_version_start=r.version, param_version_end=r.version)
        return extend_sample(
            tmpl,
            r.new_ids,
            r.new_logprobs,
            r.finish,
            version=r.version if r.version is not None else self.version,
            elapsed_s=r.elapsed_s,
            tokenizer=self.tokenizer,
        )

    @torch.no_grad()  # not inference_mode: the trainer may later backprop through tensors built from these
    def _decode(self, reqs: list[_Request]) -> None:
        """Sample continuations for one micro-batch in place (``new_ids``, ``new_logprobs``, ``finish``)."""
        dev, pad = self.device, self.special.pad_id
        ids, mask = left_pad([r.prompt_ids + r.prefix_ids for r in reqs], pad)
        ids, mask = ids.to(dev), mask.to(dev)
        pos = position_ids_from_mask(mask)
        past, logits, sampler = self._forward(input_ids=ids, attention_mask=mask, position_ids=pos)
        next_pos = pos[:, -1] + 1
        budgets = torch.tensor([r.budget for r in reqs], device=dev)
        hold = max(r.eos_floor for r in reqs)  # steps during which some row may not sample eos
        floors = torch.tensor([r.eos_floor for r in reqs], device=dev)
        done = torch.zeros(len(reqs), dtype=torch.bool, device=dev)
        toks, lps = [], []
        chunk, temp = self.cfg.chunk_tokens, self.cfg.temperature
        for step in range(int(budgets.max())):
            if step < hold:
                _mask_eos(logits, self._eos, floors > step)
            tok, lp = sampler.step(logits, temp, self.generator)
            tok = torch.where(done, pad, tok)
            toks.append(tok)
            lps.append(lp)
            done = done | torch.isin(tok, self._eos) | (budgets <= step + 1)
            if bool(done.all()) or ((step + 1) % chunk == 0 and self.interrupted):
                break
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            past, logits, sampler = self._forward(
                input_ids=tok[:, None],
                attention_mask=mask,
                position_ids=next_pos[:, None],
                **{self._cache_kwarg: past},
            )
            next_pos = next_pos + 1
        self._collect(reqs, torch.stack(toks, 1).tolist(), torch.stack(lps, 1).tolist())

    def _forward(self, **inputs: Any) -> tuple[Any, torch.Tensor, DecodeSampler]:
        """One cached forward -> (KV cache, the last position's logits [B, V], the sampler for them).
        With a plain output layer the logits are written into the sampler's ``logits`` buffer, by the
        matmul the model's own head runs (``F.linear``: ``mm``, or ``addmm`` with a bias)."""
        if self._body is None:
            out = self.model(**inputs, use_cache=True, logits_to_keep=1)
            logits = out.logits[:, -1, :]
            return _cache_of(out), logits, self._sampler_for(*logits.shape)
        out = self._body(**inputs, use_cache=True)
        hidden, weight, bias = out.last_hidden_state[:, -1, :], self._head.weight, self._head.bias
        sampler = self._sampler_for(hidden.shape[0], weight.shape[0])
        if bias is None:
            torch.mm(hidden, weight.t(), out=sampler.logits)
        else:
            torch.addmm(bias, hidden, weight.t(), out=sampler.logits)
        return _cache_of(out), sampler.logits, sampler

    def _sampler_for(self, rows: int, vocab: int) -> DecodeSampler:
        """The sampling buffers of a [rows, vocab] micro-batch, kept for the next one of that shape."""
        dtype = self.model.dtype
        if self._sampler is None or not self._sampler.fits(rows, vocab, self.device, self.cfg.top_p, dtype):
            self._sampler = None  # the old buffers go before the new ones are allocated
            self._sampler = DecodeSampler(rows, vocab, self.device, self.cfg.top_p, logits_dtype=dtype)
        return self._sampler

    def _collect(self, reqs: list[_Request], toks: list[list[int]], lps: list[list[float]]) -> None:
        eos = set(self.special.eos_ids)
        for r, row_t, row_l in zip(reqs, toks, lps, strict=True):
            r.finish = "abort"
            for t, lp in zip(row_t, row_l, strict=True):
                r.new_ids.append(t)
                r.new_logprobs.append(lp)
                if t in eos:
                    r.finish = "stop"
                    break
                if len(r.new_ids) >= r.budget:
                    r.finish = "length"
                    break


__all__ = ["HFRolloutWorker"]
