"""Weight buckets over a real torch.distributed gloo group: two processes on this CPU.

The trainer side (rank 0) runs in a spawned process and broadcasts the trainer's bucket stream of the
tiny model's weights (``GroupSender``); the receiver (rank 1) runs here: the transport's own receive
stream, the HF worker, and the GPU workers on their engine STAND-INS (tests/engine/standin_*.py: no GPU
here; their groups are gloo where the real engines use NCCL). The plan goes by argument (the control
plane), the bytes by broadcast.
"""

from __future__ import annotations

import multiprocessing as mp
import socket

import pytest
import torch

from rl_engine.config import ModelConfig, TinyModelSpec, apply_overrides, parse_config
from rl_engine.models import load_model
from rl_engine.models.tiny import save_tiny_model
from rl_engine.presets import get_preset
from rl_engine.types import TransferGroup
from rl_engine.weights.broadcast import BroadcastWeights, GroupInit, join_group
from rl_engine.weights.buckets import plan_buckets, unpack

pytestmark = pytest.mark.timeout(120)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _group(port: int, max_bucket_bytes: int, backend: str) -> TransferGroup:
    """Rank 1 of 2 in the test's sender's group on this host."""
    return TransferGroup("127.0.0.1", port, 1, 2, backend, 300.0, max_bucket_bytes)


def _named(model_dir) -> dict[str, torch.Tensor]:
    model = load_model(ModelConfig(path=str(model_dir)))
    return {n: (p.detach() * 1.5).to(torch.bfloat16) for n, p in model.named_parameters()}


def _plan(named: dict[str, torch.Tensor], bucket_bytes: int, split: bool):
    return plan_buckets(
        ((n, tuple(t.shape)) for n, t in named.items()), torch.bfloat16, bucket_bytes, split=split
    )


def _start_sender(port: int, named: dict[str, torch.Tensor], bucket_bytes: int, split: bool, world: int = 2):
    from tests.pipeline.gloo_sender import send

    args = (port, named, bucket_bytes, world, split)
    proc = mp.get_context("spawn").Process(target=send, args=args, daemon=True)
    proc.start()
    return proc


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(TinyModelSpec(seed=3), tmp_path_factory.mktemp("gloo") / "tiny")


def _cfg(model_dir, rollout: str = "{backend: hf, n: 2}", *more: str):
    data = get_preset("demo-cpu")
    data["model"].pop("tiny")
    gpus = [] if "hf" in rollout else ["resources.rollout_gpus=1"]
    overrides = [f"model.path={model_dir}", "model.dtype=bfloat16", f"rollout={rollout}", *gpus, *more]
    return parse_config(apply_overrides(data, overrides))


def test_split_buckets_arrive_bit_identical_in_order(model_dir):
    named = _named(model_dir)
    manifest = _plan(named, 16 * 1024, split=True)  # 16 KiB: many buckets, the embedding split across some
    assert len(manifest.buckets) > 5 and not manifest.whole
    port = _free_port()
    proc = _start_sender(port, named, 16 * 1024, split=True)
    group = join_group(GroupInit("127.0.0.1", port, 2, 1, "gloo", timeout_s=60))
    got = dict(BroadcastWeights(manifest, group, torch.device("cpu")).items())
    proc.join(30)
    assert proc.exitcode == 0
    assert list(got) == list(named)
    assert all(torch.equal(got[k], named[k]) and got[k].dtype == torch.bfloat16 for k in named)


def test_hf_worker_receives_into_its_parameter_buffer_and_bumps_the_version_only_on_success(model_dir):
    from rl_engine.backends import build_rollout_worker

    worker = build_rollout_worker(_cfg(model_dir))
    named = _named(model_dir)
    manifest = _plan(named, 64 * 1024, split=True)
    buffer = worker._flat.flat.data_ptr()
    port = _free_port()
    proc = _start_sender(port, named, 64 * 1024, split=True)
    worker.init_weight_transfer(_group(port, manifest.max_bucket_bytes, "gloo"))
    worker.receive_weights(manifest, 4)
    proc.join(30)
    assert proc.exitcode == 0 and worker.version == 4
    params = dict(worker.model.named_parameters())
    assert all(torch.equal(params[k], v) for k, v in named.items())
    assert worker._flat.flat.data_ptr() == buffer  # received in place, into the flat parameter buffer
    # a plan that does not fit the model is refused before anything is received or loaded
    wrong = plan_buckets([("model.embed_tokens.weight", (3, 3))], torch.bfloat16, 1024)
    with pytest.raises(ValueError, match="has shape"):
        worker.receive_weights(wrong, 5)
    assert worker.version == 4 and all(torch.equal(params[k], v) for k, v in named.items())


def test_unpack_checks_the_metadata_against_the_bytes():
    raw = torch.arange(12, dtype=torch.float32).view(torch.uint8)
    ((name, t),) = unpack(raw, ["a"], ["float32"], [[3, 4]])
    assert name == "a" and torch.equal(t, torch.arange(12, dtype=torch.float32).view(3, 4))
    with pytest.raises(ValueError, match="expected 44 bytes"):
        unpack(raw, ["a"], ["float32"], [[11]])
    with pytest.raises(ValueError, match="as many names, dtypes and shapes"):
        unpack(raw, ["a", "b"], ["float32"], [[1]])


@pytest.mark.parametrize("backend", ["sglang", "vllm"])
def test_engine_worker_receives_a_broadcast_as_one_checked_session(model_dir, monkeypatch, backend):
    """The GPU workers' broadcast path (``init_weight_transfer`` + ``receive_weights``) on the engine
    STAND-INS, whose receivers join this gloo group (the real engines use NCCL). The vLLM stand-in
    receives as vLLM's packed consumer does, so a bucket larger than its buffer would desynchronise."""
    from rl_engine.backends import build_rollout_worker
    from tests.engine import standin_sglang, standin_vllm

    (standin_sglang if backend == "sglang" else standin_vllm).install(monkeypatch)
    worker = build_rollout_worker(_cfg(model_dir, f"{{backend: {backend}, n: 2}}"))
    try:
        named = _named(model_dir)
        manifest = _plan(named, 64 * 1024, split=False)
        assert len(manifest.buckets) > 1
        port = _free_port()
        proc = _start_sender(port, named, 64 * 1024, split=False)
        worker.init_weight_transfer(
            _group(port, manifest.max_bucket_bytes, "gloo" if backend == "sglang" else "nccl")
        )
        worker.receive_weights(manifest, version=5)
        proc.join(30)
        assert proc.exitcode == 0 and worker.version == 5
        model = worker.engine.model
        assert model.loads == len(manifest.buckets)  # one broadcast, one load per bucket
        assert all(torch.equal(model.weights[k], v) for k, v in named.items())
        stamped = (
            worker.engine.tokenizer_manager.weight_version
            if backend == "sglang"
            else worker.engine.weight_version
        )
        assert stamped == "5"
        # split buckets cannot be loaded by an engine: refused before any engine call
        with pytest.raises(ValueError, match="split=False"):
            worker.receive_weights(_plan(named, 16 * 1024, split=True), 6)
        assert worker.version == 5
    finally:
        worker.close()


def test_vllm_refuses_a_bucket_larger_than_its_packed_buffer(model_dir, monkeypatch):
    from rl_engine.backends import build_rollout_worker
    from rl_engine.rollout.engine_loop import EngineError
    from tests.engine import standin_vllm

    standin_vllm.install(monkeypatch)
    worker = build_rollout_worker(_cfg(model_dir, "{backend: vllm, n: 2}"))
    try:
        worker.engine.join = False  # no sender in this test: only the request is recorded
        named = _named(model_dir)
        manifest = _plan(named, 64 * 1024, split=False)
        worker.init_weight_transfer(
            TransferGroup("10.0.0.1", 29500, 1, 2, "nccl", 300.0, manifest.max_bucket_bytes - 1)
        )
        with pytest.raises(EngineError, match="does not fit"):
            worker.receive_weights(manifest, 2)
        assert worker.version == 0 and worker.engine.calls.count("pause_generation") == 0
    finally:
        worker.close()
