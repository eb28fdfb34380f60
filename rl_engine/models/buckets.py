"""Weight buckets: a model's parameters as a stream of flat, typed buffers in the rollout dtype.

The trainer never builds a whole-model copy to sync weights. ``plan_buckets`` lays the parameters out
in buckets of at most ``bucket_bytes`` (a ``WeightManifest``: names, shapes, where each lies); a
``WeightStream`` yields one ``WeightBucket`` (that plan + one flat buffer, already cast to the rollout
dtype) at a time, and a receiver checks the manifest once (``check_against``) and copies each bucket
into its parameters (``load_bucket``) before asking for the next. So a sync costs one bucket of
extra memory on each side, whatever the model size.

Bucketing is separate from transport: ``LocalWeightStream`` produces buckets in-process (the in-process
driver, the GPU check, and every transport's sending side); the Ray object store transport
(``rl_engine.pipeline.sync.ObjectStoreWeights``) ships each bucket as raw bytes; an NCCL or gloo
transport broadcasts the same flat buffers into receivers that pre-allocate them from the manifest.

A tensor larger than the room left in a bucket is split across buckets by element range
(``split=True``, the default): the bound holds even for a 150k x 896 embedding. Receivers that need
whole tensors (an engine's ``load_weights``) plan with ``split=False``; a bucket then grows to hold
its largest tensor.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class TensorPiece:
    """Elements ``start .. start + numel`` of the flattened tensor ``name`` at ``offset`` in a bucket."""

    name: str
    shape: tuple[int, ...]  # the whole tensor's shape
    start: int
    numel: int
    offset: int

    @property
    def whole(self) -> bool:
        return self.start == 0 and self.numel == math.prod(self.shape)


@dataclass(frozen=True)
class BucketPlan:
    index: int
    numel: int
    pieces: tuple[TensorPiece, ...]


@dataclass(frozen=True)
class WeightManifest:
    """The layout of one sync: every bucket's pieces, in the dtype every bucket is sent in."""

    dtype: str  # a torch dtype name: "bfloat16", "float32", ...
    buckets: tuple[BucketPlan, ...]

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    @property
    def numel(self) -> int:
        return sum(b.numel for b in self.buckets)

    @property
    def nbytes(self) -> int:
        return self.numel * self.torch_dtype.itemsize

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {p.name: p.shape for b in self.buckets for p in b.pieces}


@dataclass(frozen=True)
class WeightBucket:
    """One bucket: its plan and ``flat`` [plan.numel] in the manifest's dtype."""

    plan: BucketPlan
    flat: torch.Tensor

    def pieces(self) -> Iterator[tuple[TensorPiece, torch.Tensor]]:
        """(piece, 1-D view of its elements) for every piece of the bucket."""
        for p in self.plan.pieces:
            yield p, self.flat[p.offset : p.offset + p.numel]

    def to_bytes(self) -> np.ndarray:
        """The flat buffer as uint8 numpy (a view on CPU; numpy has no bfloat16, bytes carry any dtype)."""
        return self.flat.detach().cpu().view(torch.uint8).numpy()

    @staticmethod
    def from_bytes(plan: BucketPlan, dtype: torch.dtype, data: np.ndarray) -> WeightBucket:
        """The inverse of ``to_bytes``, without a copy (a read-only array stays read-only: only read it)."""
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # object-store arrays are read-only views
            raw = torch.from_numpy(np.asarray(data, dtype=np.uint8).reshape(-1))
        return WeightBucket(plan, raw.view(dtype)[: plan.numel])


def plan_buckets(
    named_shapes: Iterable[tuple[str, tuple[int, ...]]],
    dtype: torch.dtype,
    bucket_bytes: int,
    *,
    split: bool = True,
) -> WeightManifest:
    """Lay tensors out in order into buckets of at most ``bucket_bytes`` of ``dtype``.

    ``split``: a tensor that does not fit in the room left is split by element range (every bucket but
    the last is exactly full); otherwise it starts a new bucket, which may exceed the size on its own.
    """
    limit = max(1, bucket_bytes // dtype.itemsize)
    buckets: list[BucketPlan] = []
    pieces: list[TensorPiece] = []
    used = 0

    def close() -> None:
        nonlocal pieces, used
        if pieces:
            buckets.append(BucketPlan(len(buckets), used, tuple(pieces)))
        pieces, used = [], 0

    for name, shape in named_shapes:
        shape = tuple(int(d) for d in shape)
        numel, start = math.prod(shape), 0
        if not split and used and used + numel > limit:
            close()
        while True:
            take = min(limit - used, numel - start) if split else numel
            pieces.append(TensorPiece(name, shape, start, take, used))
            used, start = used + take, start + take
            if used >= limit:
                close()
            if start >= numel:
                break
    close()
    return WeightManifest(str(dtype).removeprefix("torch."), tuple(buckets))


def check_against(manifest: WeightManifest, params: Mapping[str, torch.Tensor]) -> None:
    """Every tensor of the manifest exists in ``params`` with its shape (checked before any copy)."""
    shapes = manifest.shapes()
    unknown = [n for n in shapes if n not in params]
    if unknown:
        raise KeyError(f"update_weights: unknown parameter names {unknown[:5]}")
    for name, shape in shapes.items():
        dst = params[name]
        if tuple(dst.shape) != shape:
            raise ValueError(f"update_weights: {name} has shape {shape}, expected {tuple(dst.shape)}")
        if not dst.is_contiguous():
            raise ValueError(f"update_weights: {name} is not contiguous in the receiver")


@torch.no_grad()
def load_bucket(bucket: WeightBucket, params: Mapping[str, torch.Tensor]) -> None:
    """Copy a bucket's pieces into ``params`` (contiguous, on one device; cast if the dtypes differ).
    The flat buffer moves to that device once per bucket, not once per tensor."""
    if not bucket.plan.pieces:
        return
    flat = bucket.flat.to(params[bucket.plan.pieces[0].name].device)
    for p in bucket.plan.pieces:
        params[p.name].view(-1)[p.start : p.start + p.numel].copy_(flat[p.offset : p.offset + p.numel])


class WeightStream(ABC):
    """A sync as an iterable of ``WeightBucket`` in ``manifest`` order.

    Buckets may share one buffer (``reuses_buffer``): a bucket is then only valid until the next one is
    asked for — load it, or copy it, before moving on.
    """

    manifest: WeightManifest
    reuses_buffer: bool = False

    @abstractmethod
    def __iter__(self) -> Iterator[WeightBucket]: ...

    def items(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Whole tensors by name, for receivers that take a ``Mapping`` (split tensors are reassembled)."""
        partial: dict[str, torch.Tensor] = {}
        for bucket in self:
            for piece, src in bucket.pieces():
                if piece.whole:
                    yield piece.name, (src.clone() if self.reuses_buffer else src).view(piece.shape)
                    continue
                whole = partial.setdefault(piece.name, torch.empty(math.prod(piece.shape), dtype=src.dtype))
                whole[piece.start : piece.start + piece.numel] = src
                if piece.start + piece.numel == whole.numel():
                    yield piece.name, partial.pop(piece.name).view(piece.shape)


class LocalWeightStream(WeightStream):
    """Buckets filled from tensors of this process, one at a time, in one reused buffer on the tensors'
    device: the cast to the manifest's dtype happens in the copy.

    ``buffer``: a staging buffer to fill (at least the largest bucket, in the manifest's dtype, on the
    tensors' device); a caller that syncs repeatedly keeps one (``staging_buffer``) because
    page-faulting a fresh one each time costs more than the copy itself. Without it, one is allocated
    for the duration of the iteration.
    """

    reuses_buffer = True

    def __init__(
        self,
        manifest: WeightManifest,
        tensors: Mapping[str, torch.Tensor],
        buffer: torch.Tensor | None = None,
    ) -> None:
        self.manifest, self.tensors, self.buffer = manifest, tensors, buffer

    @classmethod
    def of(
        cls,
        named: Iterable[tuple[str, torch.Tensor]],
        dtype: torch.dtype,
        bucket_bytes: int,
        *,
        split: bool = True,
        buffer: torch.Tensor | None = None,
    ) -> LocalWeightStream:
        tensors = dict(named)
        shapes = ((n, tuple(t.shape)) for n, t in tensors.items())
        return cls(plan_buckets(shapes, dtype, bucket_bytes, split=split), tensors, buffer)

    @property
    def buffer_numel(self) -> int:
        return max((b.numel for b in self.manifest.buckets), default=0)

    @torch.no_grad()
    def __iter__(self) -> Iterator[WeightBucket]:
        if not self.manifest.buckets:
            return
        device = next(iter(self.tensors.values())).device
        buffer = staging_buffer(self.buffer, self.buffer_numel, self.manifest.torch_dtype, device)
        for plan in self.manifest.buckets:
            flat = buffer[: plan.numel]
            for p in plan.pieces:
                src = self.tensors[p.name].detach().reshape(-1)[p.start : p.start + p.numel]
                flat[p.offset : p.offset + p.numel].copy_(src)
            yield WeightBucket(plan, flat)


def staging_buffer(
    current: torch.Tensor | None, numel: int, dtype: torch.dtype, device: torch.device | str
) -> torch.Tensor:
    """``current`` if it can hold ``numel`` elements of ``dtype`` on ``device``, else a new buffer."""
    fits = current is not None and current.numel() >= numel and current.dtype == dtype
    if fits and current.device.type == torch.device(device).type:  # "cuda" names "cuda:0" too
        return current
    return torch.empty(numel, dtype=dtype, device=device)


__all__ = [
    "BucketPlan",
    "LocalWeightStream",
    "TensorPiece",
    "WeightBucket",
    "WeightManifest",
    "WeightStream",
    "check_against",
    "load_bucket",
    "plan_buckets",
    "staging_buffer",
]
