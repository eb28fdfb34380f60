"""ParameterSync: trainer → rollouters weight transfer behind one interface, always timed.

Both transports carry the same bucket stream (``rl_engine.models.buckets``): the trainer's parameters
cast to the rollout dtype, one flat bucket of ``trainer.weight_sync_bucket_mb`` at a time.

* ``ObjectStoreSync`` (CPU, default): ``publish_stream`` puts each bucket into the Ray object store as
  raw bytes (``TrainerActor.publish_weights``; a one-bucket model travels inline in one put) and one
  small ``ObjectStoreWeights`` that lists them; every rollouter ``ray.get``s that, then the buckets one
  at a time — numpy comes back as a read-only view of shared memory, no copy — loading each in place
  and dropping it before the next. The store holds one rollout-dtype copy until the next sync.
* ``NcclSync`` (GPU): the same buckets broadcast from the trainer (rank 0) to the rollouters through
  ``ray.util.collective`` (``nccl.py``). UNTESTED here: this machine has no GPU, and NCCL refuses two
  ranks on one device; it is written against the documented ``ray.util.collective`` API and selected
  with ``pipeline.sync_backend: nccl``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import ray

from rl_engine.models.buckets import WeightBucket, WeightManifest, WeightStream


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


@dataclass
class SyncTiming:
    """Seconds spent in one sync: publish (trainer put), load (slowest rollouter), total."""

    version: int
    publish_s: float
    load_s: float
    total_s: float
    per_rollouter: list[dict[str, float]] = field(default_factory=list)


class ParameterSync:
    """Interface: ``start(version)`` begins a sync and returns handles; ``finish`` waits and times it."""

    def __init__(self, trainer: Any, rollouters: list[Any]) -> None:
        self.trainer, self.rollouters = trainer, rollouters
        self.history: list[SyncTiming] = []

    def start(self, version: int) -> tuple[list[Any], float]:
        raise NotImplementedError

    def finish(
        self, version: int, t0: float, publish_s: float, results: list[dict[str, float]]
    ) -> SyncTiming:
        timing = SyncTiming(
            version=version,
            publish_s=publish_s,
            load_s=max((r["total_s"] for r in results), default=0.0),
            total_s=time.monotonic() - t0,
            per_rollouter=results,
        )
        self.history.append(timing)
        return timing


class ObjectStoreSync(ParameterSync):
    """Ray object store transfer (CPU and mixed clusters)."""

    def start(self, version: int) -> tuple[list[Any], float]:
        t0 = time.monotonic()
        box = ray.get(self.trainer.publish_weights.remote())
        publish_s = time.monotonic() - t0
        refs = [r.update_weights.remote(box, version) for r in self.rollouters]
        refs.append(self.trainer.mark_synced.remote())
        return refs, publish_s


class NcclSync(ParameterSync):
    """Bucketed NCCL broadcast (GPU only; untested on this CPU machine, see module docstring).

    The trainer actor and each rollouter must expose ``nccl_setup(world, rank, group)``,
    ``nccl_broadcast(version)`` (trainer: send buckets) and ``nccl_receive(version)`` (rollouter:
    receive into its own parameters and bump its version). They are thin wrappers over
    ``ray.util.collective.broadcast`` on flat buckets of ``bucket_mb``.
    """

    GROUP = "rl_engine_weights"

    def __init__(self, trainer: Any, rollouters: list[Any], bucket_mb: int = 256) -> None:
        super().__init__(trainer, rollouters)
        self.bucket_mb = bucket_mb
        from ray.util import collective

        actors = [trainer, *rollouters]
        collective.create_collective_group(
            actors,
            world_size=len(actors),
            ranks=list(range(len(actors))),
            backend="nccl",
            group_name=self.GROUP,
        )

    def start(self, version: int) -> tuple[list[Any], float]:
        t0 = time.monotonic()
        refs = [self.trainer.nccl_broadcast.remote(self.GROUP, self.bucket_mb)]
        refs += [r.nccl_receive.remote(self.GROUP, self.bucket_mb, version) for r in self.rollouters]
        refs.append(self.trainer.mark_synced.remote())
        return refs[1:], time.monotonic() - t0


def build_sync(backend: str, trainer: Any, rollouters: list[Any]) -> ParameterSync:
    if backend == "nccl":
        return NcclSync(trainer, rollouters)
    return ObjectStoreSync(trainer, rollouters)
