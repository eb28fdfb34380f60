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
    """The model's repeated blocks, which FSDP2 shards one by one: the entries of the outermost
    ``nn.ModuleList`` of the decoder (transformers' public ``get_decoder()``, else the model) whose
    entries all share one class — Llama's ``layers``, GPT-2's ``h``; a mixture-of-experts layer's
    ``experts`` list lies deeper. Empty where there is none (the root is then the one unit)."""
    body = model.get_decoder() if hasattr(model, "get_decoder") else model
    best: tuple[int, torch.nn.ModuleList] | None = None
    for name, module in body.named_modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) and len({type(m) for m in module}) == 1:
            depth = name.count(".") + 1 if name else 0
            if best is None or depth < best[0]:
                best = (depth, module)
    return list(best[1]) if best is not None else []


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


def row_blocks(rows: int, world: int) -> list[tuple[int, int]]:
    """The rows ``[lo, hi)`` of a ``rows``-row tensor each of ``world`` ranks holds under FSDP2's dim-0
    sharding (``torch.chunk``: blocks of ``ceil(rows / world)``, the last ones shorter or empty)."""
    size = -(-rows // world)
    return [(min(r * size, rows), min((r + 1) * size, rows)) for r in range(world)]


class GatheredParams:
    """The sharded parameters as a ``PieceSource`` for a weight stream, read piece by piece in order.

    A parameter of at most ``whole_max_bytes`` is all-gathered whole when the stream first reads it and
    kept until it reads another (one collective per parameter). A larger one sharded by rows (the
    embedding and output layer: 519 MiB in float32 at a 151,936 vocabulary and hidden 896) is never
    gathered whole: each piece is broadcast from the ranks that hold its rows, in slices of at most
    ``slice_bytes``, straight into the bucket. The sending rank so holds at most one small parameter or
    one slice beyond its shards, plus the stream's bucket (``peak_bytes`` counts the former).

    Every rank of the group must read the same pieces in the same order (``drain``): each is a collective.
    """

    def __init__(
        self, named: Mapping[str, torch.Tensor], ranks: Ranks, *, whole_max_bytes: int, slice_bytes: int
    ) -> None:
        self.named, self.ranks = named, ranks
        self.whole_max_bytes, self.slice_bytes = whole_max_bytes, max(slice_bytes, 1)
        self._name: str | None = None
        self._whole: torch.Tensor | None = None
        self.peak_bytes = 0

    def device_of(self, name: str) -> torch.device:
        t = self.named[name]
        return t.to_local().device if hasattr(t, "to_local") else t.device

    def copy_piece(self, name: str, start: int, out: torch.Tensor) -> None:
        t = self.named[name].detach()
        if self._by_rows(t):
            self.release()
            self._broadcast_rows(name, t, start, out)
            return
        if name != self._name:
            self.release()  # free the previous one before gathering the next
            with self.ranks.op(f"all-gather of {name}"):
                self._whole = full_tensor(t)
            self._name = name
            self._held(self._whole)
        assert self._whole is not None
        out.copy_(self._whole.reshape(-1)[start : start + out.numel()])

    def release(self) -> None:
        self._name, self._whole = None, None

    def _held(self, t: torch.Tensor) -> None:
        self.peak_bytes = max(self.peak_bytes, t.numel() * t.element_size())

    def _by_rows(self, t: torch.Tensor) -> bool:
        """A dim-0 sharded DTensor over the whole group, too large to gather whole, laid out as
        ``row_blocks`` says (anything else is gathered whole)."""
        if not hasattr(t, "to_local") or t.numel() * t.element_size() <= self.whole_max_bytes:
            return False
        from torch.distributed.tensor import Shard

        if tuple(t.placements) != (Shard(0),) or t.device_mesh.size() != self.ranks.world:
            return False
        lo, hi = row_blocks(t.shape[0], self.ranks.world)[self.ranks.rank]
        return t.to_local().shape[0] == hi - lo

    def _broadcast_rows(self, name: str, t: torch.Tensor, start: int, out: torch.Tensor) -> None:
        """Elements ``[start, start + out.numel())`` of ``t`` flattened: each rank's part of that range
        broadcast from it in slices of at most ``slice_bytes``, copied (and cast) into ``out``."""
        cols = t.numel() // t.shape[0] if t.shape[0] else 0
        local = t.to_local().reshape(-1)
        end = start + out.numel()
        step = max(1, self.slice_bytes // t.element_size())
        for owner, (lo, hi) in enumerate(row_blocks(t.shape[0], self.ranks.world)):
            a, b = max(start, lo * cols), min(end, hi * cols)
            for pos in range(a, b, step):
                n = min(step, b - pos)
                if owner == self.ranks.rank:
                    buf = local[pos - lo * cols : pos - lo * cols + n].contiguous()
                else:
                    buf = torch.empty(n, dtype=local.dtype, device=local.device)
                    self._held(buf)
                with self.ranks.op(f"broadcast of {name} rows from rank {owner}"):
                    dist.broadcast(buf, src=owner)
                out[pos - start : pos - start + n].copy_(buf)
