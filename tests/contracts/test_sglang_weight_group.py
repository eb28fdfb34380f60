"""The trainer's side of a broadcast weight sync to SGLang, against the INSTALLED SGLang (no GPU needed).

Run in SGLang's own environment (``make check-sglang VENV=...`` runs ``tests/contracts``; skipped where
sglang is not importable, as in ``make test``). Over gloo on CPU, rank 0 is
``rl_engine.backends.sglang.weights.open_sender`` sending the trainer's whole-tensor buckets (in a
spawned process), rank 1 is SGLang's own receive code as its scheduler runs it for
``update_weights_from_distributed(load_format="flattened_bucket")``: ``init_custom_process_group`` over
``tcp://``, ``FlattenedTensorBucket.empty`` and one ``torch.distributed.broadcast`` per bucket. The
tensors SGLang reconstructs must equal the trainer's, bit for bit. (The real scheduler does this on
CUDA with NCCL; only the backend differs.)
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import socket

import pytest

pytest.importorskip("sglang")

import torch

from rl_engine.weights.broadcast import WEIGHT_GROUP, GroupInit
from rl_engine.weights.buckets import LocalWeightStream

pytestmark = pytest.mark.timeout(120)


def _named() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    shapes = {
        "embed.weight": (300, 16),
        "l0.q.weight": (16, 16),
        "l0.norm.weight": (16,),
        "head.weight": (300, 16),
    }
    return {n: torch.randn(s, generator=g).to(torch.bfloat16) for n, s in shapes.items()}


def _send(port: int) -> None:
    from rl_engine.backends.sglang.weights import open_sender

    sender = open_sender(GroupInit("127.0.0.1", port, 2, 0, "gloo", timeout_s=60))
    sender.send(LocalWeightStream.of(_named().items(), torch.bfloat16, 4096, split=False))


def test_sglang_receives_the_trainers_buckets_bit_identical():
    from sglang.srt.utils.common import init_custom_process_group
    from sglang.srt.weight_sync.tensor_bucket import FlattenedTensorBucket

    named = _named()
    manifest = LocalWeightStream.of(named.items(), torch.bfloat16, 4096, split=False).manifest
    assert len(manifest.buckets) > 1
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = mp.get_context("spawn").Process(target=_send, args=(port,), daemon=True)
    proc.start()
    group = init_custom_process_group(  # as SGLang's weight updater joins (rank = rank_offset + tp_rank)
        backend="gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        timeout=datetime.timedelta(seconds=60),
        world_size=2,
        rank=1,
        group_name=WEIGHT_GROUP,
    )
    got: dict[str, torch.Tensor] = {}
    for plan in manifest.buckets:
        bucket = FlattenedTensorBucket.empty(*plan.fields(manifest.dtype), "cpu")
        torch.distributed.broadcast(bucket.get_flattened_tensor(), src=0, group=group)
        got.update(bucket.reconstruct_tensors())
    proc.join(30)
    assert proc.exitcode == 0
    assert list(got) == list(named) and all(torch.equal(got[k], named[k]) for k in named)
