"""Weight buckets on the wire: the layout both GPU engines read, and what the workers accept.

A bucket is (names, dtypes, shapes, one flat buffer). Its **wire bytes** are the row-major bytes of
each tensor, concatenated in ``names`` order with no padding — exactly what SGLang's
``load_format="flattened_bucket"`` receive and vLLM's packed NCCL consumer (with a buffer at least
one bucket large) read from one rank-0 broadcast. A flat buffer of one dtype holding the tensors
back to back has these bytes as its ``uint8`` view, so no copy is needed to send it.

The workers accept any object with the four attributes (:class:`BucketLike`), so they plug onto the
trainer's bucket stream; :class:`WeightBucket` and :func:`buckets_from_named` are the plain
implementation used for the contract entry point ``update_weights(named_tensors, version)``.
Metadata (:class:`BucketMeta`) travels on the control plane (an actor call), data on the transport.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch


class BucketLike(Protocol):
    names: Sequence[str]
    dtypes: Sequence[str]  # torch dtype names without the prefix: "bfloat16", "float32"
    shapes: Sequence[Sequence[int]]
    flat: Any  # 1-D torch tensor (any dtype) whose bytes are the wire bytes


@dataclass(frozen=True)
class BucketMeta:
    """What a receiver needs before the bytes arrive."""

    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]

    def __post_init__(self) -> None:
        if not (len(self.names) == len(self.dtypes) == len(self.shapes)) or not self.names:
            raise ValueError(
                f"a weight bucket needs as many names, dtypes and shapes (>= 1): got "
                f"{len(self.names)}, {len(self.dtypes)}, {len(self.shapes)}"
            )

    @property
    def sizes(self) -> list[int]:
        """Bytes of each tensor."""
        return [math.prod(s) * dtype_of(d).itemsize for s, d in zip(self.shapes, self.dtypes, strict=True)]

    @property
    def nbytes(self) -> int:
        return sum(self.sizes)

    @classmethod
    def of(cls, bucket: BucketLike) -> BucketMeta:
        return cls(list(bucket.names), list(bucket.dtypes), [[int(d) for d in s] for s in bucket.shapes])


@dataclass
class WeightBucket:
    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]
    flat: torch.Tensor


def dtype_of(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype name {name!r} in a weight bucket")
    return dtype


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def bucket_bytes(bucket: BucketLike) -> torch.Tensor:
    """The wire bytes of ``bucket`` as a 1-D ``uint8`` view of its flat buffer (checked against the metadata)."""
    flat = bucket.flat if isinstance(bucket.flat, torch.Tensor) else _from_numpy(bucket.flat)
    raw = flat.contiguous().reshape(-1).view(torch.uint8)
    want = BucketMeta.of(bucket).nbytes
    if raw.numel() != want:
        raise ValueError(f"weight bucket of {raw.numel()} bytes, its metadata describes {want}")
    return raw


def unpack(raw: torch.Tensor, meta: BucketMeta) -> list[tuple[str, torch.Tensor]]:
    """Named views into the wire bytes ``raw`` (1-D uint8), in the engines' layout."""
    if raw.dtype != torch.uint8 or raw.dim() != 1 or raw.numel() != meta.nbytes:
        raise ValueError(f"expected {meta.nbytes} bytes (1-D uint8), got {tuple(raw.shape)} {raw.dtype}")
    parts = raw.split(meta.sizes)
    return [
        (name, part.view(dtype_of(d)).view(shape))
        for name, d, shape, part in zip(meta.names, meta.dtypes, meta.shapes, parts, strict=True)
    ]


def buckets_from_named(
    named: Mapping[str, Any] | Iterable[tuple[str, Any]], bucket_mb: float, dtype: torch.dtype | None = None
) -> Iterator[WeightBucket]:
    """Pack named tensors (or numpy arrays) into buckets of at most ``bucket_mb`` (a larger tensor
    gets a bucket of its own), one dtype per bucket; ``dtype`` casts everything first."""
    limit = int(bucket_mb * 2**20)
    items = named.items() if isinstance(named, Mapping) else named
    batch: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, value in items:
        t = value if isinstance(value, torch.Tensor) else _from_numpy(value)
        t = t.detach().to(dtype) if dtype is not None else t.detach()
        nbytes = t.numel() * t.element_size()
        if batch and (size + nbytes > limit or t.dtype != batch[0][1].dtype):
            yield _pack(batch)
            batch, size = [], 0
        batch.append((name, t))
        size += nbytes
    if batch:
        yield _pack(batch)


def _from_numpy(value: Any) -> torch.Tensor:
    with warnings.catch_warnings():
        # Arrays from the Ray object store are read-only views; they are only read here.
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(np.ascontiguousarray(value))


def _pack(batch: list[tuple[str, torch.Tensor]]) -> WeightBucket:
    flat = torch.cat([t.reshape(-1) for _, t in batch]) if len(batch) > 1 else batch[0][1].reshape(-1)
    return WeightBucket(
        names=[n for n, _ in batch],
        dtypes=[dtype_name(t.dtype) for _, t in batch],
        shapes=[list(t.shape) for _, t in batch],
        flat=flat,
    )
