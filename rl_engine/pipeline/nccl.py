"""NCCL weight broadcast for ``NcclSync`` (GPU only; UNTESTED here: this machine has no GPU).

The transport half of a sync: the buckets are the trainer's ``weight_stream`` (``rl_engine.models
.buckets``), each flat buffer broadcast from rank 0 (the trainer). A receiver plans the same buckets
from its own parameters (identical architecture: same names, order and shapes, in the dtype it serves,
which is the one the trainer casts to), receives each into one reused buffer, and loads it through
its worker's ``update_weights`` like any other ``WeightStream``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from rl_engine.models.buckets import BucketPlan, WeightBucket, WeightManifest, WeightStream, plan_buckets


def broadcast_from(stream: WeightStream, group: str) -> dict[str, float]:
    """Trainer side (rank 0): send every bucket of ``stream``."""
    from ray.util import collective

    t0 = time.monotonic()
    for bucket in stream:
        collective.broadcast(bucket.flat, src_rank=0, group_name=group)
    return {"total_s": time.monotonic() - t0}


class NcclReceiveStream(WeightStream):
    """Receiver side: each bucket of ``manifest`` arrives by broadcast (into the worker's parameters)."""

    reuses_buffer = True

    def __init__(self, manifest: WeightManifest, group: str, device: Any) -> None:
        self.manifest, self.group, self.device = manifest, group, device

    def __iter__(self) -> Iterator[WeightBucket]:
        return self.iter_into(lambda _plan: None)

    def iter_into(self, dest_of: Callable[[BucketPlan], Any]) -> Iterator[WeightBucket]:
        """Each bucket is broadcast straight into the receiver's memory when it lends some (its
        parameters' slice), else into one reused buffer."""
        import torch
        from ray.util import collective

        buffer = None
        size = max((b.numel for b in self.manifest.buckets), default=0)
        for plan in self.manifest.buckets:
            flat = dest_of(plan)
            if flat is None:
                if buffer is None:
                    buffer = torch.empty(size, dtype=self.manifest.torch_dtype, device=self.device)
                flat = buffer[: plan.numel]
            collective.broadcast(flat, src_rank=0, group_name=self.group)
            yield WeightBucket(plan, flat)


def receive_into(worker: Any, group: str, bucket_mb: int, version: int) -> dict[str, float]:
    """Rollouter side: receive the buckets and load them bucket by bucket through ``worker.update_weights``."""
    t0 = time.monotonic()
    params = list(worker.model.named_parameters())  # the worker's module, same order as the trainer's
    dtype, device = params[0][1].dtype, params[0][1].device
    manifest = plan_buckets(((n, tuple(p.shape)) for n, p in params), dtype, bucket_mb * 2**20)
    worker.update_weights(NcclReceiveStream(manifest, group, device), version)
    return {"total_s": time.monotonic() - t0}
