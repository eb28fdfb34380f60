"""Weight buckets over a real torch.distributed gloo group: two processes on this CPU.

The trainer side (rank 0) runs in a spawned process and broadcasts the buckets of the tiny model's
weights; the receiver (rank 1) runs here. Metadata goes by argument (the control plane), bytes by
broadcast — the wire format of the GPU engines' broadcast paths.
"""

from __future__ import annotations

import multiprocessing as mp
import socket

import pytest
import torch

from rl_engine.config import TinyModelSpec
from rl_engine.models import load_model
from rl_engine.models.tiny import save_tiny_model
from rl_engine.pipeline.transport_gloo import GlooBucketReceiver, GroupInit
from rl_engine.rollout.weight_buckets import BucketMeta, WeightBucket, buckets_from_named, unpack

pytestmark = pytest.mark.timeout(120)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _named(model_dir) -> dict[str, torch.Tensor]:
    from rl_engine.config import ModelConfig

    model = load_model(ModelConfig(path=str(model_dir)))
    return {n: p.detach().to(torch.bfloat16) for n, p in model.named_parameters()}


def _start_sender(port: int, named: dict[str, torch.Tensor], bucket_mb: float, world: int = 2):
    from tests.pipeline.gloo_sender import send

    proc = mp.get_context("spawn").Process(target=send, args=(port, named, bucket_mb, world), daemon=True)
    proc.start()
    return proc


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(TinyModelSpec(seed=3), tmp_path_factory.mktemp("gloo") / "tiny")


def test_buckets_arrive_bit_identical_in_order(model_dir):
    named = _named(model_dir)
    bucket_mb = 16 * 1024 / 2**20  # 16 KiB: the tiny model (bf16, ~180 KB) makes many buckets
    metas = [BucketMeta.of(b) for b in buckets_from_named(named, bucket_mb)]
    assert len(metas) > 5
    port = _free_port()
    proc = _start_sender(port, named, bucket_mb)
    receiver = GlooBucketReceiver(GroupInit("127.0.0.1", port, 2, 1, timeout_s=60))
    got: dict[str, torch.Tensor] = {}
    for bucket in receiver.receive(metas):
        got.update(unpack(bucket.flat, BucketMeta.of(bucket)))
    proc.join(30)
    assert proc.exitcode == 0
    assert list(got) == list(named)
    assert all(torch.equal(got[k], named[k]) and got[k].dtype == torch.bfloat16 for k in named)


def test_bucket_metadata_must_match_its_bytes():
    bucket = WeightBucket(["a"], ["float32"], [[3]], torch.zeros(4))
    with pytest.raises(ValueError, match="16 bytes, its metadata describes 12"):
        from rl_engine.rollout.weight_buckets import bucket_bytes

        bucket_bytes(bucket)
    with pytest.raises(ValueError, match="as many names, dtypes and shapes"):
        BucketMeta(["a", "b"], ["float32"], [[1]])


def test_sglang_worker_receives_a_broadcast_as_one_checked_session(model_dir, monkeypatch, make_engine_cfg):
    """The SGLang worker's broadcast path (``init_weight_transfer`` + ``receive_weights``) on the
    SGLang STAND-IN, whose scheduler receives over this gloo group (the real one uses NCCL)."""
    from rl_engine.rollout import build_rollout_worker
    from tests.engine import standin_sglang

    standin_sglang.install(monkeypatch)
    worker = build_rollout_worker(make_engine_cfg(model_dir))
    try:
        named = _named(model_dir)
        bucket_mb = 64 * 1024 / 2**20
        metas = [BucketMeta.of(b) for b in buckets_from_named(named, bucket_mb)]
        port = _free_port()
        proc = _start_sender(port, named, bucket_mb)
        worker.init_weight_transfer("127.0.0.1", port, 1, 2, backend="gloo")
        worker.receive_weights(metas, version=5)
        proc.join(30)
        assert proc.exitcode == 0 and worker.version == 5
        model = worker.engine.model
        assert model.loads == len(metas) and all(torch.equal(model.weights[k], v) for k, v in named.items())
        assert worker.engine.tokenizer_manager.weight_version == "5"
    finally:
        worker.close()


@pytest.fixture
def make_engine_cfg():
    from rl_engine.config import apply_overrides, parse_config
    from rl_engine.presets import get_preset

    def make(model_dir):
        data = get_preset("demo-cpu")
        data["model"].pop("tiny")
        return parse_config(
            apply_overrides(
                data,
                [f"model.path={model_dir}", "resources.rollout_gpus=1", "rollout={backend: sglang, n: 2}"],
            )
        )

    return make
