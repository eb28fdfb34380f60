"""The trainer's side of a broadcast weight sync to a GPU engine, joined with the engine's own helper.

UNTESTED: written against the released vLLM 0.33.0 / SGLang 0.5.23 source (docs/engine.md); this
machine has no GPU and neither engine runs here. Each engine's receivers join a group the trainer
must join the same way, as rank 0, at the same time:

* vLLM (``init_weight_transfer_engine`` with NCCL init info): a ``StatelessProcessGroup`` plus a
  ``PyNcclCommunicator``; the trainer joins with ``vllm.distributed.weight_transfer.nccl_common
  .trainer_init``. A bucket is one ``broadcast`` of its bytes on the current CUDA stream (the worker
  receives in packed mode with a buffer at least one bucket large: one broadcast per bucket).
* SGLang (``init_weights_update_group``): ``sglang.srt.utils.common.init_custom_process_group`` over
  ``tcp://address:port`` with the group name; the trainer calls the same helper. Any backend SGLang
  accepts (``nccl``, ``gloo``).

Both senders take the same stream as ``transport.GroupSender``, so bucketing, naming and versioning
are the code the gloo transport exercises on CPU.
"""

from __future__ import annotations

import datetime
import os
import time
from typing import Any

import torch

from rl_engine.models.buckets import WeightStream
from rl_engine.pipeline.transport import GroupInit, GroupSender, group_device
from rl_engine.types import SendStats


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


def sglang_sender(init: GroupInit) -> GroupSender:
    """Rank 0 of SGLang's weight-update group, joined with SGLang's own helper."""
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
