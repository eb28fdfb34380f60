"""Weight buckets over a torch.distributed **gloo** process group (CPU): trainer = rank 0, receivers
= ranks 1..N. The same wire format as the GPU engines' broadcast paths (one rank-0 broadcast of each
bucket's bytes, metadata on the control plane; see ``rl_engine.rollout.weight_buckets``), so the
bucketing, naming and versioning around a broadcast run for real on a machine without a GPU.

The group is private (its own ``TCPStore`` under a ``PrefixStore``): it never touches the default
process group a trainer may use for FSDP. Every operation is bounded by ``timeout_s``.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist

from rl_engine.rollout.weight_buckets import BucketLike, BucketMeta, WeightBucket, bucket_bytes


@dataclass(frozen=True)
class GroupInit:
    """Where the group meets (rank 0 hosts the store) and who this process is in it."""

    master_address: str
    master_port: int
    world_size: int
    rank: int
    group_name: str = "rl_engine_weights"
    timeout_s: float = 300.0


@dataclass(frozen=True)
class SendStats:
    buckets: int
    bytes: int
    seconds: float


def join_group(init: GroupInit) -> dist.ProcessGroup:
    """A gloo group of ``init.world_size`` ranks; blocks until every rank joined (bounded)."""
    timeout = datetime.timedelta(seconds=init.timeout_s)
    store = dist.TCPStore(
        init.master_address, init.master_port, init.world_size, is_master=init.rank == 0, timeout=timeout
    )
    opts = dist.ProcessGroupGloo._Options()
    opts._timeout = timeout
    opts._devices = [dist.ProcessGroupGloo.create_default_device()]
    return dist.ProcessGroupGloo(dist.PrefixStore(init.group_name, store), init.rank, init.world_size, opts)


def _broadcast(group: dist.ProcessGroup, raw: torch.Tensor) -> None:
    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    group.broadcast([raw], opts).wait()


class GlooBucketSender:
    """Rank 0: broadcast buckets (the caller hands their metadata to the receivers first)."""

    def __init__(self, init: GroupInit) -> None:
        if init.rank != 0:
            raise ValueError(f"the sender is rank 0, got rank {init.rank}")
        self.group = join_group(init)

    def send(self, buckets: Iterable[BucketLike]) -> SendStats:
        t0, count, total = time.monotonic(), 0, 0
        for bucket in buckets:
            raw = bucket_bytes(bucket)
            _broadcast(self.group, raw.cpu() if raw.device.type != "cpu" else raw)
            count, total = count + 1, total + raw.numel()
        return SendStats(count, total, time.monotonic() - t0)


class GlooBucketReceiver:
    """Ranks 1..N: receive the buckets ``metas`` describe, in order, one buffer at a time."""

    def __init__(self, init: GroupInit) -> None:
        if init.rank == 0:
            raise ValueError("rank 0 is the sender")
        self.group = join_group(init)

    def receive(self, metas: Iterable[BucketMeta]) -> Iterator[WeightBucket]:
        for meta in metas:
            raw = torch.empty(meta.nbytes, dtype=torch.uint8)
            _broadcast(self.group, raw)
            yield WeightBucket(list(meta.names), list(meta.dtypes), [list(s) for s in meta.shapes], raw)
