"""SGLang's weight sync, both halves: the trainer's sending half and the rollout worker's receiving half.

Written against the released SGLang 0.5.23 API (docs/engine.md); the worker's side runs against the
stand-in engine here, the trainer's side is UNTESTED here (no GPU, no SGLang; ``tests/contracts``).

* Receiving (``SglangWeights``, the weight half of ``SGLangRolloutWorker``): one session per update —
  ``begin_weight_update``, one call per bucket (``update_weights_from_tensor`` for the object-store
  path, ``update_weights_from_distributed`` with ``load_format="flattened_bucket"`` for a broadcast),
  ``end_weight_update``, then one cache flush. Every ``(success, message)`` is checked; the version
  moves only when all succeeded. The engine's scheduler processes load the buckets.
* Sending (``open_sender``): the workers join with ``init_weights_update_group``, which is SGLang's
  ``init_custom_process_group`` over ``tcp://address:port`` with the group name; the trainer calls the
  same helper as rank 0, at the same time, and sends with ``broadcast.GroupSender``. Any backend
  SGLang accepts (``nccl``, ``gloo``).
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Iterable, Mapping
from typing import Any

from rl_engine.config import ModelConfig, SGLangRolloutConfig
from rl_engine.rollout.async_worker import AsyncEngineWorker
from rl_engine.rollout.engine_loop import EngineError
from rl_engine.types import TransferGroup
from rl_engine.weights.broadcast import WEIGHT_GROUP, GroupInit, GroupSender, group_device
from rl_engine.weights.buckets import (
    BucketPlan,
    WeightBucket,
    WeightManifest,
    WeightStream,
    as_stream,
    unpack,
)

# --- the trainer's side ------------------------------------------------------------------------------------


def open_sender(init: GroupInit) -> GroupSender:
    """Rank 0 of SGLang's weight-update group, joined with SGLang's own helper (blocks until all did)."""
    from sglang.srt.utils.common import init_custom_process_group

    if init.backend == "nccl":  # what SGLang sets for its own processes (engine.py:1898-1915)
        os.environ.setdefault("NCCL_CUMEM_ENABLE", "0")
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    group = init_custom_process_group(
        backend=init.backend,
        init_method=f"tcp://{init.master_address}:{init.master_port}",
        timeout=datetime.timedelta(seconds=init.timeout_s),
        world_size=init.world_size,
        rank=0,
        group_name=init.group_name,
    )
    return GroupSender(group, group_device(init.backend))


# --- the rollout worker's side -------------------------------------------------------------------------


def check_result(what: str, result: Any) -> None:
    """Raise unless an engine answer ``(success, message[, ...])`` / ``.success`` says success."""
    ok, message = (
        (result.success, getattr(result, "message", "")) if hasattr(result, "success") else result[:2]
    )
    if not ok:
        raise EngineError(f"sglang: {what} failed: {message}")


class SglangWeights(AsyncEngineWorker):
    """The weight half of ``SGLangRolloutWorker`` (in the rollouter's process, driving the engine's
    tokenizer manager; the engine's scheduler processes load the buckets)."""

    cfg: SGLangRolloutConfig

    def __init__(self, rollout_cfg: SGLangRolloutConfig, model_cfg: ModelConfig, *, seed: int = 0):
        super().__init__(rollout_cfg, model_cfg, seed=seed)
        self._group_ready = False

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

    def init_weight_transfer(self, group: TransferGroup) -> None:
        """Join the trainer's broadcast group (rank 0 = trainer, joining concurrently); each bucket
        arrives as one broadcast whatever its size (``group.max_bucket_bytes`` is vLLM's concern;
        SGLang's group keeps its own timeout). The trainer joins with SGLang's ``init_custom_process_group``
        (``open_sender``)."""
        from sglang.srt.managers.io_struct import InitWeightsUpdateGroupReqInput

        obj = InitWeightsUpdateGroupReqInput(
            master_address=group.master_address,
            master_port=group.master_port,
            rank_offset=group.rank_offset,
            world_size=group.world_size,
            group_name=WEIGHT_GROUP,
            backend=group.backend,
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
