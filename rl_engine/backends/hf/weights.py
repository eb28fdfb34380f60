"""The HF worker's weight sync, both halves: the trainer's sending half and the worker's receiving half.

* Receiving (``HFWeights``, the weight half of ``HFRolloutWorker``, in the rollouter's actor): a sync
  arrives as a ``WeightStream`` through ``update_weights`` (in process, object store) or by broadcast
  (``init_weight_transfer`` once, then ``receive_weights``); either way each bucket lands in its slice
  of the worker's flat parameter buffer (``rl_engine.weights.buckets.FlatParams``) when it has one. Any
  element range loads, so the trainer's buckets keep their size bound even for a huge embedding.
* Sending (``open_sender``): rank 0 of the group of ``rl_engine.weights.broadcast`` (``gloo`` in host
  memory, ``nccl`` on the GPUs), which the worker joins too.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from rl_engine.rollout.base import RolloutWorker
from rl_engine.types import TransferGroup
from rl_engine.weights.broadcast import BroadcastWeights, GroupInit, GroupSender, group_device, join_group
from rl_engine.weights.buckets import FlatParams, WeightManifest, WeightStream, load_stream


def open_sender(init: GroupInit) -> GroupSender:
    """The trainer's side of a broadcast to HF workers (joins; blocks until all did)."""
    return GroupSender.join(init)


class HFWeights(RolloutWorker):
    """The weight half of ``HFRolloutWorker``, which sets these attributes when it loads its model."""

    _params: dict[str, torch.Tensor]  # the model's parameters by name
    _flat: FlatParams | None  # the parameters' one buffer (None for mixed dtypes: piece by piece)
    _weights_lock: threading.Lock  # held by generation too: no micro-batch sees half-loaded weights
    _group: Any  # the broadcast weight group (None until init_weight_transfer)
    _group_device: torch.device

    @torch.no_grad()
    def update_weights(self, weights: Mapping[str, Any] | WeightStream, version: int) -> None:
        """Copy weights in place by parameter name; unknown names or wrong shapes are an error.

        ``weights``: numpy arrays or tensors by name, or a ``WeightStream`` of buckets (the
        trainer's sync), loaded bucket by bucket, each released before the next arrives. Either way the
        names and shapes are checked before anything is copied, and the lock keeps generation off
        half-loaded weights.
        """
        with self._weights_lock:
            if isinstance(weights, WeightStream):
                load_stream(weights, self._params, self._flat)
            else:
                self._load_weights(weights)
            self._version = int(version)

    def init_weight_transfer(self, group: TransferGroup) -> None:
        """Join the trainer's broadcast group as rank ``group.rank_offset`` (the trainer, rank 0, joins at
        the same time): ``gloo`` in host memory, ``nccl`` on this worker's GPU. Any bucket size works."""
        init = GroupInit(
            group.master_address,
            group.master_port,
            group.world_size,
            group.rank_offset,
            group.backend,
            timeout_s=group.timeout_s,
        )
        self._group = join_group(init)
        self._group_device = group_device(init.backend)

    def receive_weights(self, manifest: WeightManifest, version: int) -> None:
        """Receive the buckets of ``manifest`` by broadcast, each straight into its slice of the flat
        parameter buffer when that lives on the group's device; ``version`` once all of them landed."""
        if self._group is None:
            raise RuntimeError("hf: receive_weights before init_weight_transfer")
        self.update_weights(BroadcastWeights(manifest, self._group, self._group_device), version)

    @torch.no_grad()
    def _load_weights(self, named_tensors: Mapping[str, Any]) -> None:
        """Check every name and shape first, then copy: a bad update leaves the weights untouched."""
        unknown = [k for k in named_tensors if k not in self._params]
        if unknown:
            raise KeyError(f"update_weights: unknown parameter names {unknown[:5]}")
        staged = []
        for name, value in named_tensors.items():
            if isinstance(value, torch.Tensor):
                src = value
            else:
                with warnings.catch_warnings():
                    # Arrays from the Ray object store are read-only views; they are only read here.
                    warnings.simplefilter("ignore", UserWarning)
                    src = torch.from_numpy(np.asarray(value))
            dst = self._params[name]
            if src.shape != dst.shape:
                raise ValueError(
                    f"update_weights: {name} has shape {tuple(src.shape)}, expected {tuple(dst.shape)}"
                )
            staged.append((dst, src))
        for dst, src in staged:
            dst.copy_(src.to(device=dst.device, dtype=dst.dtype))
