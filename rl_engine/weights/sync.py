"""ParameterSync: trainer → rollouters weight transfer behind one interface, always timed.

Every transport carries the same bucket stream (``rl_engine.weights.buckets``): the trainer's
parameters cast to the rollout dtype, one flat bucket of ``trainer.weight_sync_bucket_mb`` at a time
(whole tensors per bucket for the GPU engines: ``whole_tensors`` in ``rl_engine.backends.registry``).
Each rollouter loads a sync inside its worker-exclusive section and records the new version only when
the load succeeded; a failed load fails the run (``weight sync failed: ... rollouter i: loading
weights version v failed``).

* ``ObjectStoreSync`` (``pipeline.sync_backend: object_store``, the default): the trainer publishes
  the buckets into the Ray object store (``TrainerActor.publish_weights``, ``object_store.py``) and
  every rollouter loads them one at a time from the ``ObjectStoreWeights`` it is handed.
* ``BroadcastSync`` (``gloo`` on CPU, ``nccl`` on GPUs): a torch.distributed group between the
  trainer (rank 0) and the rollout workers, joined once at start (``setup``); per sync the rollouters
  get the manifest and receive each bucket by broadcast while the trainer sends them
  (``broadcast.py``; the GPU engines' own receive paths and trainer-side joins, in
  ``rl_engine/backends/vllm/weights.py`` and ``rl_engine/backends/sglang/weights.py``). ``gloo`` is
  tested here end to end; ``nccl`` is the same code with the NCCL backend and is UNTESTED on this CPU
  machine.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field
from typing import Any

import ray

from rl_engine.types import SyncTiming, TransferGroup, WeightLoadTiming


def free_endpoint() -> tuple[str, int]:
    """This node's address and a port free right now (rank 0 of a weight group listens on it)."""
    address = ray.util.get_node_ip_address()
    with socket.socket() as s:
        s.bind((address, 0))
        return address, s.getsockname()[1]


@dataclass
class PendingSync:
    """A started sync: one load ref per rollouter (its timing) and the trainer's part of it."""

    version: int
    t0: float
    publish_s: float
    loads: list[Any]
    trainer_refs: list[Any] = field(default_factory=list)


class ParameterSync:
    """``setup`` once (after the actors are built, before the rollouters start), then per sync
    ``start(version)`` and, once every ref of the ``PendingSync`` is done, ``finish``."""

    publishes_with_step = False  # the trainer publishes at the end of a syncing train_step

    def __init__(self, trainer: Any, rollouters: list[Any]) -> None:
        self.trainer, self.rollouters = trainer, rollouters
        self.history: list[SyncTiming] = []

    def setup(self, wait_all: Any) -> None:
        """Join what the transport needs; ``wait_all(refs, stage)`` waits like the driver does."""

    def start(self, version: int) -> PendingSync:
        raise NotImplementedError

    def dispatch(self, version: int, box: list[Any], publish_s: float) -> PendingSync:
        """Hand out weights the trainer published with a step (``publishes_with_step`` transports)."""
        raise NotImplementedError(f"{type(self).__name__} does not publish with the step")

    def finish(self, pending: PendingSync, results: list[WeightLoadTiming]) -> SyncTiming:
        """``results``: the ``loads`` refs' values (each rollouter's timing)."""
        timing = SyncTiming(
            version=pending.version,
            publish_s=pending.publish_s,
            load_s=max((r.total_s for r in results), default=0.0),
            total_s=time.monotonic() - pending.t0,
            per_rollouter=results,
        )
        self.history.append(timing)
        return timing


class ObjectStoreSync(ParameterSync):
    """Ray object store transfer (CPU and mixed clusters)."""

    publishes_with_step = True

    def start(self, version: int) -> PendingSync:
        """A sync outside a train step (resume): publish now, then hand it out."""
        t0 = time.monotonic()
        box = ray.get(self.trainer.publish_weights.remote())
        pending = self.dispatch(version, box, time.monotonic() - t0)
        pending.trainer_refs.append(self.trainer.mark_synced.remote())
        return pending

    def dispatch(self, version: int, box: list[Any], publish_s: float) -> PendingSync:
        """Hand a published sync (``[ref]`` from ``publish_weights``) to every rollouter; no wait."""
        loads = [r.update_weights.remote(box, version) for r in self.rollouters]
        return PendingSync(version, time.monotonic() - publish_s, publish_s, loads)


class BroadcastSync(ParameterSync):
    """Rank-0 broadcast over a torch.distributed group (``gloo`` | ``nccl``), joined in ``setup``."""

    def __init__(self, trainer: Any, rollouters: list[Any], backend: str, timeout_s: float) -> None:
        super().__init__(trainer, rollouters)
        self.backend, self.timeout_s = backend, timeout_s
        self.manifest: Any = None  # ObjectRef of the WeightManifest every sync follows

    def setup(self, wait_all: Any) -> None:
        """Rank offsets in rollouter order (an engine takes one rank per GPU); the trainer joins as
        rank 0 at the same time as every rollouter (each join waits for all of them)."""
        refs = [self.trainer.bucket_plan.remote(), self.trainer.weight_sync_endpoint.remote()]
        refs += [r.weight_transfer_ranks.remote() for r in self.rollouters]
        manifest, (address, port), *ranks = wait_all(refs, "weight sync setup")
        world = 1 + sum(ranks)
        joins = [self.trainer.open_weight_sender.remote(address, port, world, self.backend, self.timeout_s)]
        offset = 1
        for r, n in zip(self.rollouters, ranks, strict=True):
            group = TransferGroup(
                master_address=address,
                master_port=int(port),
                rank_offset=offset,
                world_size=world,
                backend=self.backend,
                timeout_s=self.timeout_s,
                max_bucket_bytes=manifest.max_bucket_bytes,
            )
            joins.append(r.init_weight_transfer.remote(group))
            offset += n
        wait_all(joins, "weight sync setup")
        self.manifest = ray.put(manifest)

    def start(self, version: int) -> PendingSync:
        t0 = time.monotonic()
        loads = [r.receive_weights.remote(self.manifest, version) for r in self.rollouters]
        return PendingSync(version, t0, 0.0, loads, [self.trainer.broadcast_weights.remote()])


def build_sync(cfg: Any, trainer: Any, rollouters: list[Any]) -> ParameterSync:
    backend = cfg.pipeline.sync_backend
    if backend == "object_store":
        return ObjectStoreSync(trainer, rollouters)
    return BroadcastSync(trainer, rollouters, backend, cfg.pipeline.sync_timeout_s)
