"""Weight buckets through the Ray object store: the transport of ``pipeline.sync_backend: object_store``.

``publish_stream`` puts each bucket of the trainer's stream into the store as raw bytes (a one-bucket
model travels inline in one put) and one small ``ObjectStoreWeights`` that lists them; a receiver
``ray.get``s that, then iterates it: the buckets arrive one at a time — numpy comes back as a read-only
view of shared memory, no copy — each loaded before the next is fetched. The store holds one
rollout-dtype copy until the next sync.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import ray

from rl_engine.weights.buckets import WeightBucket, WeightManifest, WeightStream


class ObjectStoreWeights(WeightStream):
    """A published sync: its manifest and, per bucket, an ``ObjectRef`` of the raw bytes (or the bytes
    themselves when the model is one bucket). Iterating fetches one bucket at a time."""

    def __init__(self, manifest: WeightManifest, parts: list[Any]) -> None:
        self.manifest, self.parts = manifest, parts

    def __iter__(self) -> Iterator[WeightBucket]:
        dtype = self.manifest.torch_dtype
        for plan, part in zip(self.manifest.buckets, self.parts, strict=True):
            data = ray.get(part) if isinstance(part, ray.ObjectRef) else part
            yield WeightBucket.from_bytes(plan, dtype, data)
            del data  # the consumer has loaded it: release the mapping before fetching the next


def publish_stream(stream: WeightStream) -> tuple[Any, list[Any]]:
    """Put a stream into the object store -> (ref of its ``ObjectStoreWeights``, the bucket refs).

    Each bucket is copied into the store before the next one is built, so the sender never holds more
    than one bucket. Keep every returned ref alive until the receivers have loaded the sync.
    """
    if len(stream.manifest.buckets) <= 1:  # one put, as cheap as putting the tensors themselves
        parts: list[Any] = [b.to_bytes() for b in stream]
        return ray.put(ObjectStoreWeights(stream.manifest, parts)), []
    refs = [ray.put(b.to_bytes()) for b in stream]
    return ray.put(ObjectStoreWeights(stream.manifest, refs)), refs
