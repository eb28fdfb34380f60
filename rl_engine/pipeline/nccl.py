"""NCCL weight broadcast helpers for ``NcclSync`` (GPU only; UNTESTED here: this machine has no GPU).

Parameters are packed into flat buckets of at most ``bucket_mb`` (same order and dtype on both sides,
taken from ``named_parameters`` of identical architectures), each broadcast from rank 0 (trainer).
"""

from __future__ import annotations

import time
from typing import Any


def _buckets(named: list[tuple[str, Any]], bucket_mb: int) -> list[list[tuple[str, Any]]]:
    limit = bucket_mb * 2**20
    out: list[list[tuple[str, Any]]] = [[]]
    size = 0
    for name, p in named:
        nbytes = p.numel() * p.element_size()
        if out[-1] and (size + nbytes > limit or p.dtype != out[-1][0][1].dtype):
            out.append([])
            size = 0
        out[-1].append((name, p))
        size += nbytes
    return out


def broadcast_from(model: Any, group: str, bucket_mb: int) -> dict[str, float]:
    """Trainer side (rank 0): send every parameter bucket."""
    import torch
    from ray.util import collective

    t0 = time.monotonic()
    for bucket in _buckets(list(model.named_parameters()), bucket_mb):
        flat = torch.cat([p.detach().reshape(-1) for _, p in bucket]).contiguous()
        collective.broadcast(flat, src_rank=0, group_name=group)
    return {"total_s": time.monotonic() - t0}


def receive_into(worker: Any, group: str, bucket_mb: int, version: int) -> dict[str, float]:
    """Rollouter side: receive the buckets and hand named views to ``worker.update_weights``."""
    import torch
    from ray.util import collective

    t0 = time.monotonic()
    model = worker.model  # the HF/vLLM worker's module with the same parameter order as the trainer
    for bucket in _buckets(list(model.named_parameters()), bucket_mb):
        numel = sum(p.numel() for _, p in bucket)
        flat = torch.empty(numel, dtype=bucket[0][1].dtype, device=bucket[0][1].device)
        collective.broadcast(flat, src_rank=0, group_name=group)
        named, offset = {}, 0
        for name, p in bucket:
            named[name] = flat[offset : offset + p.numel()].view_as(p)
            offset += p.numel()
        worker.update_weights(named, version)
    return {"total_s": time.monotonic() - t0}
