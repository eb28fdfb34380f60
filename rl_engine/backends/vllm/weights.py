"""vLLM's weight sync, both halves: the trainer's sending half and the rollout worker's receiving half.

Written against the released vLLM 0.33.0 API (docs/engine.md); the object-store and gloo paths run on
vLLM's CPU build and against the stand-in engine here, the NCCL path is UNTESTED (no GPU).

* Receiving (``VllmWeights``, the weight half of ``VLLMRolloutWorker``): one session per update —
  ``start_weight_update()``, one call per bucket, then ``finish_weight_update(weight_version=
  str(version))``; the version moves only when all of it succeeded. A bucket arrives either by
  ``collective_rpc`` into :class:`VLLMWorkerExtension` (bytes: the object-store path) or by an NCCL
  broadcast of the bucket's bytes through vLLM's weight-transfer engine (``init_weight_transfer`` +
  ``receive_weights``; packed mode, one broadcast per bucket), or, with ``backend="gloo"`` (CPU; vLLM
  has no gloo transfer engine), by a gloo broadcast that :class:`VLLMWorkerExtension` receives itself.
  The extension runs inside vLLM's worker processes (``worker_extension_cls``).
* Sending (``open_sender``): over NCCL the trainer joins vLLM's own group (``init_weight_transfer_engine``
  with NCCL init info: a ``StatelessProcessGroup`` plus a ``PyNcclCommunicator``) with
  ``vllm.distributed.weight_transfer.nccl_common.trainer_init``, as rank 0, at the same time as the
  workers; a bucket is one ``broadcast`` of its bytes on the current CUDA stream (the workers receive in
  packed mode with a buffer at least one bucket large). Over gloo it is
  ``rl_engine.weights.broadcast.GroupSender``.

Both senders take the same stream as ``broadcast.GroupSender``, so bucketing, naming and versioning are
the code the gloo transport exercises on CPU.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from rl_engine.config import ModelConfig, VLLMRolloutConfig
from rl_engine.rollout.async_worker import AsyncEngineWorker
from rl_engine.rollout.engine_loop import EngineError
from rl_engine.types import SendStats, TransferGroup
from rl_engine.weights.broadcast import BucketSender, GroupInit, GroupSender, broadcast_bytes, join_group
from rl_engine.weights.buckets import (
    BucketPlan,
    WeightBucket,
    WeightManifest,
    WeightStream,
    as_stream,
    unpack,
)

# --- the trainer's side ------------------------------------------------------------------------------------


class VllmSender:
    """Rank 0 of vLLM's NCCL weight-transfer group (``PyNcclCommunicator``)."""

    def __init__(self, comm: Any) -> None:
        self.comm = comm
        self.device = torch.device("cuda", torch.cuda.current_device())  # where trainer_init bound it

    @classmethod
    def join(cls, init: GroupInit) -> VllmSender:
        from vllm.distributed.weight_transfer.nccl_common import trainer_init

        if init.backend != "nccl":
            raise ValueError(f"vLLM's weight transfer broadcasts over NCCL, not {init.backend!r}")
        info = {
            "master_address": init.master_address,
            "master_port": init.master_port,
            "world_size": init.world_size,
        }
        return cls(trainer_init(info, rank=0))

    def send(self, stream: WeightStream) -> SendStats:
        t0, count, total = time.monotonic(), 0, 0
        cuda_stream = torch.cuda.current_stream()
        for bucket in stream:
            raw = bucket.wire()
            if raw.device != self.device:
                raw = raw.to(self.device)
            self.comm.broadcast(raw, src=0, stream=cuda_stream)
            # the stream's staging buffer is refilled for the next bucket: wait for this broadcast
            cuda_stream.synchronize()
            count, total = count + 1, total + raw.numel()
        return SendStats(count, total, time.monotonic() - t0)


def open_sender(init: GroupInit) -> BucketSender:
    """The trainer's side of a broadcast to vLLM workers (joins; blocks until all did): vLLM's own NCCL
    group, or over gloo the group of ``rl_engine.weights.broadcast``, which each vLLM worker joins itself."""
    return VllmSender.join(init) if init.backend == "nccl" else GroupSender.join(init)


# --- what vLLM's layerwise reload warns about, and which of it is expected -------------------------------

# vLLM's reload (``model_loader/reload/layerwise.py``, ``finalize_layerwise_processing``) logs, through
# this logger, ``"%s: Failed to load weights"`` with a module's class name for every module that holds
# loadable tensors of its own and got none during the update; it then keeps the module's tensors as they
# were. A weight sync never sends to two kinds of module, by design, so it warned about them at every
# update (299 times in 300 steps), though nothing failed: a module whose tensors are all buffers the
# engine computes from the config (``RotaryEmbedding``'s cos/sin cache: the trainer sends parameters
# only, and no checkpoint holds it), and one whose parameters an earlier module holds too (a tied
# ``ParallelLMHead``: the sync sends the embedding once, under the embedding's name, and the reload
# counts it for that module only).
RELOAD_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"
RELOAD_NOTHING_LOADED = "%s: Failed to load weights"


def layers_a_sync_never_loads(model: torch.nn.Module) -> set[str]:
    """Class names of the modules of ``model`` that a weight sync never sends a tensor to: each of
    their own tensors is a buffer, or a parameter that a module earlier in ``model.modules()`` holds
    too. A class with any module that does take weights is left out (its warning would be real)."""
    seen: set[int] = set()  # the parameters of the modules walked so far (tied ones appear again)
    never: set[str] = set()
    takes: set[str] = set()
    for module in model.modules():
        params = [p for _, p in module.named_parameters(recurse=False)]
        buffers = [b for _, b in module.named_buffers(recurse=False)]
        own = [p for p in params if id(p) not in seen]
        seen.update(id(p) for p in params)
        if not params and not buffers:
            continue
        (takes if own else never).add(type(module).__name__)
    return never - takes


class ExpectedReloadWarnings(logging.Filter):
    """Drops vLLM's "<class>: Failed to load weights" for the classes in ``layers`` (installed on
    ``RELOAD_LOGGER`` in each engine worker); every other record passes."""

    def __init__(self, layers: set[str]) -> None:
        super().__init__()
        self.layers = frozenset(layers)

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        return not (record.msg == RELOAD_NOTHING_LOADED and args[:1] and args[0] in self.layers)


def quiet_expected_reload_warnings(model: torch.nn.Module) -> list[str]:
    """Install (once per process: a new filter replaces the last) an ``ExpectedReloadWarnings`` for
    ``model`` on vLLM's reload logger; the class names it quiets."""
    layers = layers_a_sync_never_loads(model)
    logger = logging.getLogger(RELOAD_LOGGER)
    for old in [f for f in logger.filters if isinstance(f, ExpectedReloadWarnings)]:
        logger.removeFilter(old)
    logger.addFilter(ExpectedReloadWarnings(layers))
    return sorted(layers)


# --- inside vLLM's worker processes ---------------------------------------------------------------------


class VLLMWorkerExtension:
    """Mixed into vLLM's GPU worker (``worker_extension_cls``); methods run via ``collective_rpc``.

    ``collective_rpc`` arguments reach the worker msgpack-decoded without types (an ndarray arrives
    as a list), so a bucket travels as ``bytes`` plus its metadata.
    """

    def rl_engine_load_bucket(
        self, names: list[str], dtypes: list[str], shapes: list[list[int]], data: bytes
    ) -> int:
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

    def rl_engine_quiet_reload_warnings(self) -> list[str]:
        """Quiet the reload's warnings about the modules a sync never sends to (``layers_a_sync_never_loads``);
        the class names quieted."""
        return quiet_expected_reload_warnings(self.get_model())  # type: ignore[attr-defined]

    def rl_engine_join_group(
        self, master_address: str, master_port: int, rank_offset: int, world_size: int, timeout_s: float
    ) -> int:
        """Join the trainer's gloo weight group as rank ``rank_offset`` + this worker's rank."""
        rank = int(rank_offset) + int(self.rank)  # type: ignore[attr-defined]
        init = GroupInit(master_address, int(master_port), int(world_size), rank, "gloo", timeout_s=timeout_s)
        self.rl_engine_group = join_group(init)
        return rank

    def rl_engine_receive_bucket(self, names: list[str], dtypes: list[str], shapes: list[list[int]]) -> int:
        """Receive one bucket by the trainer's gloo broadcast (host memory) and load it."""
        nbytes = sum(math.prod(s) * getattr(torch, d).itemsize for d, s in zip(dtypes, shapes, strict=True))
        raw = torch.empty(nbytes, dtype=torch.uint8)
        broadcast_bytes(self.rl_engine_group, raw)
        named = unpack(raw.to(self.device), names, dtypes, shapes)  # type: ignore[attr-defined]
        self.get_model().load_weights(weights=named)  # type: ignore[attr-defined]
        return len(named)


# --- the rollout worker's side -------------------------------------------------------------------------


class VllmWeights(AsyncEngineWorker):
    """The weight half of ``VLLMRolloutWorker`` (in the rollouter's process, driving the engine; the
    bytes land in vLLM's worker processes through :class:`VLLMWorkerExtension`)."""

    cfg: VLLMRolloutConfig

    def __init__(self, rollout_cfg: VLLMRolloutConfig, model_cfg: ModelConfig, *, seed: int = 0):
        self._transfer: str | None = None  # the broadcast backend, once init_weight_transfer ran
        self._transfer_buffer = 0  # nccl: the packed buffer's bytes
        self._reload_warnings_quiet = False  # rl_engine_quiet_reload_warnings ran in the engine's workers
        super().__init__(rollout_cfg, model_cfg, seed=seed)

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

    def init_weight_transfer(self, group: TransferGroup) -> None:
        """Join the trainer's broadcast group (rank 0 = trainer, joining concurrently).

        nccl: vLLM's weight-transfer engine in packed mode with a buffer of ``group.max_bucket_bytes``,
        so every bucket arrives as exactly one broadcast; ``group.timeout_s`` cannot be passed on (vLLM's
        group keeps its own). gloo: each engine worker joins a gloo group itself (the extension)."""
        from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

        backend = group.backend
        if backend == "gloo":
            args = (
                group.master_address,
                group.master_port,
                group.rank_offset,
                group.world_size,
                group.timeout_s,
            )
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
            "master_address": group.master_address,
            "master_port": group.master_port,
            "rank_offset": group.rank_offset,
            "world_size": group.world_size,
            "packed": True,
            "packed_buffer_size_bytes": group.max_bucket_bytes,
        }
        self._control(
            "init_weight_transfer_engine",
            self.engine.init_weight_transfer_engine(WeightTransferInitRequest(init_info=info)),
        )
        self._transfer, self._transfer_buffer = "nccl", group.max_bucket_bytes

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
            if not self._reload_warnings_quiet:
                self._control(
                    "quiet the reload's expected warnings",
                    self.engine.collective_rpc("rl_engine_quiet_reload_warnings"),
                )
                self._reload_warnings_quiet = True
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
