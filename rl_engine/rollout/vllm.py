"""vLLM rollout worker (GPU only; written against vLLM 0.33.0 as documented in GPU_BACKENDS.md).

vllm is imported lazily inside the worker: this module imports on a CPU-only machine, and its pure
helpers (sampling params, output conversion) are unit-tested there. The engine is ``AsyncLLM`` on a
private event loop thread, because partial rollout needs ``pause_generation(mode="abort")`` while a
batch is in flight, which the synchronous ``LLM`` cannot do.

Log-prob convention: the engine is built with ``logprobs_mode="processed_logprobs"`` so returned
log-probs are after temperature (vLLM's default returns raw-logit log-probs), matching the trainer.

Weights: ``update_weights(named_tensors, version)`` goes through ``collective_rpc`` into
``VLLMWorkerExtension.load_named_weights`` (the worker's ``model.load_weights``), fine for the object
store path; for large models the pipeline uses the NCCL transfer API instead
(``init_weight_transfer`` / ``receive_weights``), which streams a trainer-side broadcast.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import threading
import time
from collections.abc import Mapping
from typing import Any

from rl_engine.config import ModelConfig, VLLMRolloutConfig
from rl_engine.rollout.base import RolloutWorker
from rl_engine.rollout.common import extend_sample, needs_continuation, normalise_finish, sample_template
from rl_engine.types import FinishReason, Prompt, Sample


def sampling_kwargs(cfg: VLLMRolloutConfig, max_tokens: int, eos_ids: list[int]) -> dict[str, Any]:
    """Keyword arguments of ``vllm.SamplingParams`` for one response (logprobs=0: the sampled token's)."""
    return {
        "n": 1,
        "temperature": cfg.temperature,
        "top_p": cfg.top_p,
        "max_tokens": max_tokens,
        "logprobs": 0,
        "stop_token_ids": list(eos_ids),
        "skip_special_tokens": True,
    }


def convert_completion(completion: Any, eos_ids: list[int]) -> tuple[list[int], list[float], FinishReason]:
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


class VLLMWorkerExtension:
    """Mixed into vLLM's GPU worker (``worker_extension_cls``); methods run via ``collective_rpc``."""

    def load_named_weights(self, named: list[tuple[str, Any]]) -> int:
        import torch

        device = next(self.model_runner.model.parameters()).device  # type: ignore[attr-defined]
        weights = [(n, torch.as_tensor(t).to(device)) for n, t in named]
        self.model_runner.model.load_weights(weights=weights)  # type: ignore[attr-defined]
        return len(weights)


class VLLMRolloutWorker(RolloutWorker):
    """Rollout on vLLM ``AsyncLLM``; see the module docstring."""

    def __init__(self, rollout_cfg: VLLMRolloutConfig, model_cfg: ModelConfig, *, seed: int = 0):
        super().__init__()
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        from rl_engine.models import ensure_model, load_tokenizer, special_token_ids

        self.cfg = rollout_cfg
        path = ensure_model(model_cfg)
        self.tokenizer = load_tokenizer(model_cfg)
        self.special = special_token_ids(model_cfg, self.tokenizer)
        extra: dict[str, Any] = {}
        try:  # the official in-place update API needs the engine built with a transfer backend
            from vllm.config import WeightTransferConfig

            extra["weight_transfer_config"] = WeightTransferConfig(backend=rollout_cfg.weight_transfer)
        except ImportError:  # older vLLM: collective_rpc + load_weights still works
            pass
        args = AsyncEngineArgs(
            model=str(path),
            tokenizer=str(model_cfg.tokenizer_path or path),
            dtype=model_cfg.dtype,
            seed=seed,
            tensor_parallel_size=rollout_cfg.tensor_parallel_size,
            gpu_memory_utilization=rollout_cfg.gpu_memory_utilization,
            enforce_eager=rollout_cfg.enforce_eager,
            enable_prefix_caching=rollout_cfg.enable_prefix_caching,
            max_num_seqs=rollout_cfg.max_num_seqs,
            trust_remote_code=model_cfg.trust_remote_code,
            logprobs_mode="processed_logprobs",
            worker_extension_cls=f"{__name__}.VLLMWorkerExtension",
            **extra,
        )
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="vllm-loop", daemon=True)
        self._thread.start()
        self.engine = self._call(self._make_engine(AsyncLLM, args))
        self._ids = itertools.count()

    async def _make_engine(self, cls: Any, args: Any) -> Any:
        return cls.from_engine_args(args)

    def _call(self, coro: Any, timeout: float | None = None) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def _engine(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Call an engine method on the engine's loop thread, awaiting it if it is a coroutine."""

        async def invoke() -> Any:
            result = getattr(self.engine, method)(*args, **kwargs)
            return await result if inspect.isawaitable(result) else result

        return self._call(invoke())

    # --- generation -----------------------------------------------------------------------------------
    async def _one(
        self, token_ids: list[int], max_tokens: int
    ) -> tuple[list[int], list[float], FinishReason]:
        from vllm import SamplingParams

        params = SamplingParams(**sampling_kwargs(self.cfg, max_tokens, self.special.eos_ids))
        final = None
        async for out in self.engine.generate({"prompt_token_ids": token_ids}, params, f"r{next(self._ids)}"):
            final = out
        if final is None:  # aborted before the first output
            return [], [], "abort"
        return convert_completion(final.outputs[0], self.special.eos_ids)

    async def _many(
        self, jobs: list[tuple[list[int], int]]
    ) -> list[tuple[list[int], list[float], FinishReason]]:
        return list(await asyncio.gather(*(self._one(ids, budget) for ids, budget in jobs)))

    def _run(self, samples: list[Sample]) -> list[Sample]:
        t0 = time.perf_counter()
        if self.interrupted:  # paused: nothing starts until clear_interrupt()
            return [
                extend_sample(
                    s, [], [], "abort", version=self.version, elapsed_s=0.0, tokenizer=self.tokenizer
                )
                for s in samples
            ]
        jobs = [
            (s.prompt_ids + s.response_ids, self.cfg.max_new_tokens - len(s.response_ids)) for s in samples
        ]
        results = self._call(self._many(jobs))
        dt = time.perf_counter() - t0
        return [
            extend_sample(s, ids, lps, fin, version=self.version, elapsed_s=dt, tokenizer=self.tokenizer)
            for s, (ids, lps, fin) in zip(samples, results, strict=True)
        ]

    def generate(self, prompts: list[Prompt], n: int) -> list[Sample]:
        return self._run([sample_template(p, self.version) for p in prompts for _ in range(n)])

    def resume(self, samples: list[Sample]) -> list[Sample]:
        todo = [i for i, s in enumerate(samples) if needs_continuation(s, self.cfg.max_new_tokens)]
        done = self._run([samples[i] for i in todo])
        out = list(samples)
        for i, s in zip(todo, done, strict=True):
            out[i] = s
        return out

    # --- partial rollout --------------------------------------------------------------------------------
    def interrupt(self) -> None:
        """Abort in-flight requests: each returns its tokens so far with finish_reason 'abort'."""
        super().interrupt()
        self._engine("pause_generation", mode="abort", clear_cache=False)

    def clear_interrupt(self) -> None:
        super().clear_interrupt()
        self._engine("resume_generation")

    # --- weights -----------------------------------------------------------------------------------------
    def update_weights(self, named_tensors: Mapping[str, Any], version: int) -> None:
        self._engine("collective_rpc", "load_named_weights", args=(list(named_tensors.items()),))
        # Cached prefixes were computed by the old weights.
        self._engine("reset_prefix_cache", reset_running_requests=True)
        self._version = int(version)

    def init_weight_transfer(self, init_info: dict[str, Any]) -> None:
        """Join the trainer's NCCL group (master address/port, rank_offset, world_size)."""
        self._engine("init_weight_transfer_engine", {"init_info": init_info})

    def receive_weights(
        self, names: list[str], dtype_names: list[str], shapes: list[list[int]], version: int
    ) -> None:
        """Receive one broadcast of weights from the trainer (which broadcasts concurrently)."""
        self._engine("start_weight_update")
        self._engine(
            "update_weights", {"update_info": {"names": names, "dtype_names": dtype_names, "shapes": shapes}}
        )
        self._engine("finish_weight_update", weight_version=version)
        self._engine("reset_prefix_cache", reset_running_requests=True)
        self._version = int(version)

    def close(self) -> None:
        try:
            self.engine.shutdown()
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
