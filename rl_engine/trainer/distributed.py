"""The trainer group's distributed parts: the process group, FSDP2 sharding, the token split, collectives.

A trainer group is ``world`` ranks, one process each, joined in one ``torch.distributed`` process group
(gloo on CPU, NCCL on GPU). Every rank holds the whole step's samples (they are small); each optimizer
step's mini-batch is split across the ranks by token count (``split_by_tokens``), every rank runs the
forward/backward of its share with the loss normalised by the whole mini-batch's counts, and FSDP2
(``torch.distributed.fsdp.fully_shard``, per decoder layer and at the root) reduce-scatters the
gradients. FSDP averages gradients over the ranks; the trainer multiplies each rank's loss by
``world`` so the reduced gradient is the *sum* of the shares, which is the one-rank mini-batch gradient.

FSDP's collectives run inside every forward and backward, so every rank must run the same number of
them: ranks with fewer micro-batches pad with zero-weight ones (``pad_plans``). One rank (``world`` 1)
runs the same step code with no process group: the split is the identity and every collective is a no-op.

Every collective has a timeout (``init_group``'s ``timeout_s``): a rank that hangs or dies makes the
others raise instead of waiting forever; ``CollectiveError`` names the rank and the operation.
"""

from __future__ import annotations

import datetime
import heapq
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist


class CollectiveError(RuntimeError):
    """A collective of the trainer group failed or timed out; the message names the rank and the op."""


@dataclass(frozen=True)
class Ranks:
    """This process's place in the trainer group. ``world`` 1: no process group, collectives are no-ops."""

    rank: int = 0
    world: int = 1

    @property
    def sharded(self) -> bool:
        return self.world > 1

    def all_reduce(self, t: torch.Tensor, op: str = "sum", what: str = "all_reduce") -> torch.Tensor:
        """In-place sum (or max) of ``t`` over the ranks; returns ``t``."""
        if self.sharded:
            with self.op(what):
                dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
        return t

    def barrier(self, what: str = "barrier") -> None:
        if self.sharded:
            with self.op(what):
                dist.barrier()

    @contextmanager
    def op(self, what: str) -> Iterator[None]:
        """Turn a failed or timed-out collective into a ``CollectiveError`` naming this rank and ``what``
        (one rank: nothing to name, errors pass through)."""
        if not self.sharded:
            yield
            return
        try:
            yield
        except CollectiveError:
            raise
        except (RuntimeError, dist.DistBackendError) as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise CollectiveError(
                f"trainer rank {self.rank}/{self.world}: collective '{what}' failed ({first})"
            ) from exc


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def init_group(ranks: Ranks, init_method: str, backend: str, timeout_s: float) -> None:
    """Join the trainer group (every rank calls it; returns once all joined). No-op for one rank."""
    if not ranks.sharded or dist.is_initialized():
        return
    dist.init_process_group(
        backend,
        init_method=init_method,
        rank=ranks.rank,
        world_size=ranks.world,
        timeout=datetime.timedelta(seconds=timeout_s),
    )


def destroy_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's repeated blocks: the classes HF names in ``_no_split_modules`` (as verl and TRL wrap
    them), else the children of the decoder's ``layers`` / ``h`` list."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    found = [m for m in model.modules() if type(m).__name__ in names]
    if found:
        return found
    body = model.get_decoder() if hasattr(model, "get_decoder") else model
    blocks = getattr(body, "layers", None) or getattr(body, "h", None) or []
    return list(blocks)


def shard(root: torch.nn.Module, model: torch.nn.Module, device: torch.device) -> None:
    """FSDP2: ``fully_shard`` each decoder layer of ``model``, then ``root`` (which holds ``model``: the
    embeddings, final norm and output layer are sharded with the root). Parameters stay in their dtype
    (float32 master weights); compute precision is the caller's autocast, as on one rank."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh)
    fully_shard(root, mesh=mesh)


def split_by_tokens(costs: list[int], world: int) -> list[list[int]]:
    """Positions 0..n-1 of a mini-batch shared out to ``world`` ranks by token count.

    Longest first, each to the rank with the fewest tokens so far (ties: the lowest rank); each rank's
    positions stay in mini-batch order. A rank may get none when there are fewer rows than ranks.
    """
    heap = [(0, r) for r in range(world)]
    shares: list[list[int]] = [[] for _ in range(world)]
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        load, r = heapq.heappop(heap)
        shares[r].append(i)
        heapq.heappush(heap, (load + costs[i], r))
    return [sorted(s) for s in shares]


def pad_plans(plans: list[list[list[int]]]) -> int:
    """The number of micro-batches every rank runs: the most any rank has (at least one)."""
    return max(1, *(len(p) for p in plans))


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """A sharded (DTensor) parameter gathered whole on every rank; a plain tensor as it is."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


class GatheredParams(Mapping[str, torch.Tensor]):
    """Parameters by name, each gathered whole only when asked for and kept until another is asked for.

    A weight stream reads its buckets' pieces in parameter order, so at most one whole parameter (one
    all-gather) exists at a time on the sending rank, plus the stream's bucket. Every rank of the group
    must read the same names in the same order (``drain``), since each new name is a collective.
    """

    def __init__(self, named: Mapping[str, torch.Tensor], ranks: Ranks) -> None:
        self.named, self.ranks = named, ranks
        self._name: str | None = None
        self._whole: torch.Tensor | None = None

    def __getitem__(self, name: str) -> torch.Tensor:
        if name != self._name:
            self._whole = None  # free the previous one before gathering the next
            with self.ranks.op(f"all-gather of {name}"):
                self._whole = full_tensor(self.named[name].detach())
            self._name = name
        assert self._whole is not None
        return self._whole

    def __iter__(self) -> Iterator[str]:
        return iter(self.named)

    def __len__(self) -> int:
        return len(self.named)

    def release(self) -> None:
        self._name, self._whole = None, None
