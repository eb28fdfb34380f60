"""Weight buckets by rank-0 broadcast over a private torch.distributed group: ``gloo`` (CPU) or ``nccl``.

The transport of ``pipeline.sync_backend: gloo | nccl``. The trainer is rank 0, the rollout
workers ranks 1..N (an engine with tensor parallelism takes one rank per GPU). The buckets are the
trainer's ``WeightStream`` (``rl_engine.weights.buckets``); their plans (the ``WeightManifest``) go to
the receivers on the control plane (an actor call), the bytes by one broadcast of each bucket's
``uint8`` view — the wire format the GPU engines read too (SGLang ``flattened_bucket``, vLLM packed).

* ``join_group``: a group of its own (its own ``TCPStore`` under a ``PrefixStore``, rank 0 hosts it):
  it never touches the default process group a trainer may use for FSDP. Every collective is bounded
  by ``GroupInit.timeout_s``.
* ``GroupSender``: rank 0, sends a stream. The trainer's side for each rollout backend is the
  backend's ``open_sender`` (``rl_engine.backends``, the registry's entry): this group for the HF worker
  (and vLLM over gloo), each engine's own helper for vLLM over NCCL and SGLang
  (``rl_engine/backends/vllm/weights.py``, ``rl_engine/backends/sglang/weights.py``).
* ``BroadcastWeights``: a receiver's ``WeightStream``; each bucket arrives straight into the memory the
  receiver lends (the HF worker's flat parameter buffer) when it is on the group's device.
"""

from __future__ import annotations

import datetime
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

import psutil
import torch
import torch.distributed as dist

from rl_engine.types import SendStats
from rl_engine.weights.buckets import BucketPlan, WeightBucket, WeightManifest, WeightStream

WEIGHT_GROUP = "rl_engine_weights"
BACKENDS = ("gloo", "nccl")
GLOO_IFNAME = "GLOO_SOCKET_IFNAME"  # the interface gloo binds to (gloo and torch.distributed document it)


@dataclass(frozen=True)
class GroupInit:
    """Where the group meets (rank 0 hosts the store) and who this process is in it."""

    master_address: str
    master_port: int
    world_size: int
    rank: int
    backend: str = "gloo"  # one of BACKENDS
    group_name: str = WEIGHT_GROUP
    timeout_s: float = 300.0


class BucketSender(Protocol):
    def send(self, stream: WeightStream) -> SendStats: ...


def group_device(backend: str) -> torch.device:
    """Where the group's tensors must live: host memory for gloo, this process's GPU for nccl."""
    return torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")


def route_address(master_address: str) -> str:
    """This host's address on the route to ``master_address`` (a UDP connect sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((master_address, 9))
        return s.getsockname()[0]


def join_group(init: GroupInit) -> dist.ProcessGroup:
    """A ``backend`` group of ``init.world_size`` ranks; blocks until every rank joined (bounded)."""
    if init.backend not in BACKENDS:
        raise ValueError(f"weight group backend {init.backend!r}: expected one of {BACKENDS}")
    timeout = datetime.timedelta(seconds=init.timeout_s)
    store = dist.TCPStore(
        init.master_address, init.master_port, init.world_size, is_master=init.rank == 0, timeout=timeout
    )
    prefixed = dist.PrefixStore(init.group_name, store)
    if init.backend == "nccl":  # GPU only: UNTESTED on the CPU machine this was written on
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        return dist.ProcessGroupNCCL(prefixed, init.rank, init.world_size, opts)
    with _gloo_interface(init.master_address):
        return dist.ProcessGroupGloo(prefixed, init.rank, init.world_size, timeout)


def interface_of(address: str) -> str | None:
    """The name of this host's network interface holding ``address``; None when none does."""
    for name, addrs in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == address for a in addrs):
            return name
    return None


@contextmanager
def _gloo_interface(master_address: str) -> Iterator[None]:
    """Gloo's own knob, ``GLOO_SOCKET_IFNAME``, set while a group is built to the interface on the route
    to ``master_address``: by default gloo binds to what the hostname resolves to, a loopback address on
    many hosts, which ranks on other nodes cannot reach. A value the user set is left as it is."""
    if os.environ.get(GLOO_IFNAME):
        yield
        return
    name = interface_of(route_address(master_address))
    if name is None:
        yield
        return
    os.environ[GLOO_IFNAME] = name
    try:
        yield
    finally:
        os.environ.pop(GLOO_IFNAME, None)


def broadcast_bytes(group: dist.ProcessGroup, raw: torch.Tensor) -> None:
    """Rank 0's ``raw`` (1-D ``uint8``) lands in every rank's ``raw``; returns when it has."""
    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    group.broadcast([raw], opts).wait()


class GroupSender:
    """Rank 0 of a torch.distributed group: one broadcast per bucket (the receivers got the manifest)."""

    def __init__(self, group: dist.ProcessGroup, device: torch.device) -> None:
        self.group, self.device = group, device

    @classmethod
    def join(cls, init: GroupInit) -> GroupSender:
        if init.rank != 0:
            raise ValueError(f"the sender is rank 0, got rank {init.rank}")
        return cls(join_group(init), group_device(init.backend))

    def send(self, stream: WeightStream) -> SendStats:
        t0, count, total = time.monotonic(), 0, 0
        for bucket in stream:
            raw = bucket.wire()
            if raw.device != self.device:  # e.g. a trainer on another GPU than its NCCL rank
                raw = raw.to(self.device)
            broadcast_bytes(self.group, raw)
            count, total = count + 1, total + raw.numel()
        return SendStats(count, total, time.monotonic() - t0)


class BroadcastWeights(WeightStream):
    """A receiver's view of one sync: the buckets of ``manifest``, each arriving by broadcast."""

    reuses_buffer = True

    def __init__(self, manifest: WeightManifest, group: dist.ProcessGroup, device: torch.device) -> None:
        self.manifest, self.group, self.device = manifest, group, device

    def __iter__(self) -> Iterator[WeightBucket]:
        return self.iter_into(lambda _plan: None)

    def iter_into(self, dest_of: Callable[[BucketPlan], torch.Tensor | None]) -> Iterator[WeightBucket]:
        """Into ``dest_of(plan)`` when it lends memory on the group's device, else into one reused buffer."""
        buffer: torch.Tensor | None = None
        for plan in self.manifest.buckets:
            flat = dest_of(plan)
            if flat is None or flat.device.type != self.device.type:
                if buffer is None:
                    size = max(b.numel for b in self.manifest.buckets)
                    buffer = torch.empty(size, dtype=self.manifest.torch_dtype, device=self.device)
                flat = buffer[: plan.numel]
            broadcast_bytes(self.group, flat.view(torch.uint8))
            yield WeightBucket(plan, flat)
