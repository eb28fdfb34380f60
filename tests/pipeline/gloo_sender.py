"""Rank 0 of the gloo transport tests, run in a spawned process (imports only torch and the transport)."""

from __future__ import annotations

import torch

from rl_engine.pipeline.transport_gloo import GlooBucketSender, GroupInit
from rl_engine.rollout.weight_buckets import buckets_from_named


def send(port: int, named: dict[str, torch.Tensor], bucket_mb: float, world: int) -> None:
    sender = GlooBucketSender(GroupInit("127.0.0.1", port, world, 0, timeout_s=60))
    sender.send(buckets_from_named(named, bucket_mb))
