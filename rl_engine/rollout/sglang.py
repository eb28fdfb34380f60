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
* Weights: one session per update — ``begin_weight_update``, one call per bucket
  (``update_weights_from_tensor`` for the object-store path, ``update_weights_from_distributed`` with
  ``load_format="flattened_bucket"`` for a broadcast), ``end_weight_update``, then one cache flush.
  Every ``(success, message)`` is checked; the version moves only when all succeeded.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from typing import Any

from rl_engine.config import ModelConfig, SGLangRolloutConfig
from rl_engine.models.buckets import BucketPlan, WeightBucket, WeightManifest, WeightStream, as_stream, unpack
from rl_engine.rollout.async_worker import AsyncEngineWorker, Result
from rl_engine.rollout.common import normalise_finish
from rl_engine.rollout.engine_loop import EngineError

WEIGHT_GROUP = "rl_engine_weights"


def sampling_params(cfg: SGLangRolloutConfig, max_new_tokens: int, eos_ids: list[int]) -> dict[str, Any]:
    """The ``sampling_params`` dict of one request (n=1: the worker expands groups itself)."""
    return {
        "n": 1,
        "max_new_tokens": max_new_tokens,
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


def check_result(what: str, result: Any) -> None:
    """Raise unless an engine answer ``(success, message[, ...])`` / ``.success`` says success."""
    ok, message = (
        (result.success, getattr(result, "message", "")) if hasattr(result, "success") else result[:2]
    )
    if not ok:
        raise EngineError(f"sglang: {what} failed: {message}")


class SGLangRolloutWorker(AsyncEngineWorker):
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
        self._group_ready = False

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

    async def _one(self, token_ids: list[int], budget: int) -> Result:
        if self.interrupted:  # checked on the loop thread right before the engine: see engine_loop
            return [], [], "abort"
        out = await self.engine.async_generate(
            input_ids=token_ids,
            sampling_params=sampling_params(self.cfg, budget, self.special.eos_ids),
            return_logprob=True,
            rid=f"rl{next(self._request_ids)}",
        )
        return convert_output(out, self.special.eos_ids)

    # --- weights -----------------------------------------------------------------------------------------
    @property
    def weight_transfer_ranks(self) -> int:
        """Ranks the engine takes in a broadcast weight group: one per tensor-parallel scheduler."""
        return self.cfg.tp_size

    def update_weights(self, weights: WeightStream | Mapping[str, Any], version: int) -> None:
        """Object-store / in-process path: a ``WeightStream`` of whole-tensor buckets (named tensors are
        planned into buckets of ``weight_bucket_mb`` in the serving dtype); ``update_weights_from_tensor``
        per bucket (tensors shared with the scheduler processes by torch multiprocessing, one payload
        per TP rank)."""
        import torch
        from sglang.srt.managers.io_struct import UpdateWeightsFromTensorReqInput

        stream = as_stream(weights, self._dtype, int(self.cfg.weight_bucket_mb * 2**20), split=False)
        stream.manifest.require_whole()
        dtype, count = stream.manifest.dtype, len(stream.manifest.buckets)

        def request(bucket: WeightBucket) -> Any:
            raw = bucket.wire()
            if torch.cuda.is_available():  # colocated: the schedulers map it by CUDA IPC, no host copy
                raw = raw.cuda()
            named = unpack(raw, *bucket.plan.fields(dtype))
            payload = self.engine._serialize_tensors_per_rank(named, None)
            obj = UpdateWeightsFromTensorReqInput(
                serialized_named_tensors=payload,
                flush_cache=False,
                weight_version=_stamp(bucket.plan, count, version),
            )

            async def call(keep: Any = raw) -> Any:
                # ``keep`` holds the shared memory until the schedulers have loaded it: a CUDA IPC
                # handle to a freed block would read whatever the allocator put there next.
                return await self.engine.tokenizer_manager.update_weights_from_tensor(obj, None)

            return call()

        self._session(stream, request, version)

    def init_weight_transfer(
        self,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        *,
        max_bucket_bytes: int = 0,
        backend: str = "nccl",
        timeout_s: float | None = None,
    ) -> None:
        """Join the trainer's broadcast group (rank 0 = trainer, joining concurrently); each bucket
        arrives as one broadcast whatever its size (``max_bucket_bytes`` is vLLM's concern; SGLang's
        group keeps its own timeout). The trainer joins with SGLang's ``init_custom_process_group``
        (``rl_engine.pipeline.engine_senders``)."""
        from sglang.srt.managers.io_struct import InitWeightsUpdateGroupReqInput

        obj = InitWeightsUpdateGroupReqInput(
            master_address=master_address,
            master_port=int(master_port),
            rank_offset=int(rank_offset),
            world_size=int(world_size),
            group_name=WEIGHT_GROUP,
            backend=backend,
        )
        check_result(
            "init_weights_update_group",
            self._control(
                "init_weights_update_group",
                self.engine.tokenizer_manager.init_weights_update_group(obj, None),
            ),
        )
        self._group_ready = True

    def receive_weights(self, manifest: WeightManifest, version: int) -> None:
        """Broadcast path: the trainer broadcasts each bucket's bytes while this waits on the engine."""
        from sglang.srt.managers.io_struct import UpdateWeightsFromDistributedReqInput

        if not self._group_ready:
            raise EngineError("sglang: receive_weights before init_weight_transfer")
        manifest.require_whole()
        dtype, count = manifest.dtype, len(manifest.buckets)

        def request(plan: BucketPlan) -> Any:
            names, dtypes, shapes = plan.fields(dtype)
            obj = UpdateWeightsFromDistributedReqInput(
                names=names,
                dtypes=dtypes,
                shapes=shapes,
                group_name=WEIGHT_GROUP,
                flush_cache=False,
                load_format="flattened_bucket",
                weight_version=_stamp(plan, count, version),
            )
            return self.engine.tokenizer_manager.update_weights_from_distributed(obj, None)

        self._session(manifest.buckets, request, version)

    def _session(self, items: Iterable[Any], request: Any, version: int) -> None:
        """begin → one checked call per bucket, each completed before the next bucket is produced (a
        stream may reuse its buffer) → end → flush the cache; the version moves last."""
        from sglang.srt.managers.io_struct import BeginWeightUpdateReqInput, EndWeightUpdateReqInput

        tm = self.engine.tokenizer_manager
        self._gate.wait_paused()
        check_result(
            "begin_weight_update",
            self._control("begin_weight_update", tm.begin_weight_update(BeginWeightUpdateReqInput(), None)),
        )
        try:
            for item in items:
                check_result("weight bucket load", self._control("weight bucket load", request(item)))
        finally:
            ended = self._control("end_weight_update", tm.end_weight_update(EndWeightUpdateReqInput(), None))
        check_result("end_weight_update", ended)
        check_result("flush_cache", self._control("flush_cache", tm.flush_cache()))
        self._version = int(version)


def _stamp(plan: BucketPlan, count: int, version: int) -> str | None:
    """The engine stamps ``weight_version`` with the last bucket of a session."""
    return str(int(version)) if plan.index == count - 1 else None
