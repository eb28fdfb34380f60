"""SGLang rollout worker (GPU only), written against the released SGLang 0.5.23 API (docs/engine.md).

sglang is imported lazily; the pure helpers are unit-tested on CPU. ``sglang.Engine`` runs its event
loop only inside its synchronous methods, so the worker never calls them: the engine is created
inside a coroutine on the worker's own :class:`~rl_engine.rollout.engine_loop.EngineLoop` thread
(it adopts the running loop) and only coroutines are submitted to it — ``async_generate`` and the
tokenizer manager's pause / continue / weight-update coroutines. Every wait is bounded.

* Interrupt: :class:`~rl_engine.rollout.engine_loop.InterruptGate` over the tokenizer manager's
  ``pause_generation(mode="abort")`` / ``continue_generation``; aborted requests come back with their
  partial ``output_ids`` and log-probs (finish type ``abort``). No request enters the engine once the
  interrupt flag is set, so none waits at the engine's pause gate.
* Log-probs: SGLang returns log-softmax(logits / temperature) before any top-p/top-k cut — the
  engine-wide convention, so top_p < 1 is exact. ``SGLANG_RETURN_ORIGINAL_LOGPROB`` (no temperature)
  is refused; ``sampling_defaults="openai"`` keeps generation_config.json from adding sampling knobs,
  and penalties/min_p/top_k are pinned neutral per request.
* Weights: the worker's receiving half is ``rl_engine.backends.sglang.weights`` (``SglangWeights``, its base
  class), beside the trainer's sending half: one session per update, one checked call per bucket (from
  tensors for the object store, ``flattened_bucket`` for a broadcast), one cache flush; the version
  moves only when all succeeded.
"""

from __future__ import annotations

import json
import os
from typing import Any

from rl_engine.backends.sglang.weights import SglangWeights
from rl_engine.config import ModelConfig, SGLangRolloutConfig
from rl_engine.rollout.async_worker import EngineRequest, Result
from rl_engine.rollout.common import normalise_finish
from rl_engine.rollout.engine_loop import EngineError


def sampling_params(
    cfg: SGLangRolloutConfig, max_new_tokens: int, eos_ids: list[int], min_new_tokens: int = 0
) -> dict[str, Any]:
    """The ``sampling_params`` dict of one request (n=1: the worker expands groups itself);
    ``min_new_tokens`` (0 unless ``RolloutWorker.min_new_tokens`` is set) masks eos out for the first tokens."""
    return {
        "n": 1,
        "max_new_tokens": max_new_tokens,
        "min_new_tokens": min_new_tokens,
        "temperature": cfg.temperature,
        "top_p": cfg.top_p,
        "top_k": -1,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "stop_token_ids": list(eos_ids),
    }


def engine_kwargs(cfg: SGLangRolloutConfig, model_cfg: ModelConfig, path: str, seed: int) -> dict[str, Any]:
    """``sglang.Engine`` keywords; ``model.override_config`` reaches it as ``json_model_override_args``."""
    return {
        "model_path": path,
        "tokenizer_path": str(model_cfg.tokenizer_path or path),
        "tp_size": cfg.tp_size,
        "dtype": model_cfg.dtype,
        "mem_fraction_static": cfg.mem_fraction_static,
        "random_seed": seed,
        "skip_tokenizer_init": True,  # token ids in and out: the worker owns the tokenizer
        "trust_remote_code": model_cfg.trust_remote_code,
        "json_model_override_args": json.dumps(model_cfg.override_config),
        "sampling_defaults": "openai",
    }


def convert_output(out: dict[str, Any], eos_ids: list[int]) -> Result:
    """One ``async_generate`` result -> (token ids, sampled-token log-probs, finish reason).

    ``meta_info["output_token_logprobs"]`` holds ``(logprob, token_id, text)`` per generated token.
    """
    ids = [int(t) for t in out.get("output_ids", [])]
    meta = out.get("meta_info", {})
    triples = meta.get("output_token_logprobs") or []
    if len(triples) != len(ids):
        raise ValueError(f"SGLang returned {len(triples)} log-prob entries for {len(ids)} tokens")
    for (_, tok, *_rest), want in zip(triples, ids, strict=True):
        if int(tok) != want:
            raise ValueError("SGLang log-prob entries do not follow output_ids")
    lps = [float(lp) for lp, *_ in triples]
    reason = (meta.get("finish_reason") or {}).get("type")
    return ids, lps, normalise_finish(reason, ids[-1] if ids else None, eos_ids)


class SGLangRolloutWorker(SglangWeights):
    """Rollout on ``sglang.Engine`` driven through its coroutines; see the module docstring."""

    backend = "sglang"
    cfg: SGLangRolloutConfig

    def __init__(self, rollout_cfg: SGLangRolloutConfig, model_cfg: ModelConfig, *, seed: int = 0):
        if os.environ.get("SGLANG_RETURN_ORIGINAL_LOGPROB", "").lower() in ("1", "true", "yes"):
            raise EngineError(
                "SGLANG_RETURN_ORIGINAL_LOGPROB is set: SGLang would return log-probs without the "
                "temperature, which the trainer does not recompute; unset it"
            )
        super().__init__(rollout_cfg, model_cfg, seed=seed)

    def engine_kwargs(self, model_cfg: ModelConfig, path: str, seed: int) -> dict[str, Any]:
        return engine_kwargs(self.cfg, model_cfg, path, seed)

    async def _build(self, kwargs: dict[str, Any]) -> Any:
        import sglang

        return sglang.Engine(**kwargs)  # inside a coroutine: the engine adopts the running loop

    async def _pause(self) -> None:
        from sglang.srt.managers.io_struct import PauseGenerationReqInput

        await self.engine.tokenizer_manager.pause_generation(PauseGenerationReqInput(mode="abort"))

    async def _resume(self) -> None:
        from sglang.srt.managers.io_struct import ContinueGenerationReqInput

        await self.engine.tokenizer_manager.continue_generation(ContinueGenerationReqInput())

    async def _one(self, req: EngineRequest) -> Result:
        if self.interrupted:  # checked on the loop thread right before the engine: see engine_loop
            return [], [], "abort"
        out = await self.engine.async_generate(
            input_ids=req.token_ids,
            sampling_params=sampling_params(self.cfg, req.max_tokens, self.special.eos_ids, req.min_tokens),
            return_logprob=True,
            rid=f"rl{next(self._request_ids)}",
        )
        return convert_output(out, self.special.eos_ids)
