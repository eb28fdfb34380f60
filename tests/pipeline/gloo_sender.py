"""Rank 0 of the broadcast transport tests, run in a spawned process (imports only torch and the transport)."""

from __future__ import annotations

import torch

from rl_engine.weights.broadcast import GroupInit, GroupSender
from rl_engine.weights.buckets import LocalWeightStream


def send(port: int, named: dict[str, torch.Tensor], bucket_bytes: int, world: int, split: bool) -> None:
    sender = GroupSender.join(GroupInit("127.0.0.1", port, world, 0, "gloo", timeout_s=60))
    sender.send(LocalWeightStream.of(named.items(), torch.bfloat16, bucket_bytes, split=split))
