"""Weight sync as a stream of buckets: layout, the in-process HF worker, and the Ray object store path."""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

from rl_engine.backends import build_rollout_worker
from rl_engine.trainer import PolicyTrainer
from rl_engine.weights.buckets import LocalWeightStream, check_against, load_bucket, plan_buckets
from tests.engine.test_trainer import _scored_batch

SHAPES = [("a", (10, 7)), ("b", (3,)), ("c", (40,)), ("d", (0,)), ("e", (5, 5))]


def test_buckets_split_large_tensors_and_never_exceed_the_size():
    m = plan_buckets(SHAPES, torch.float32, 16 * 4)  # 16 elements per bucket
    total = sum(math.prod(s) for _, s in SHAPES)  # 138
    assert [b.numel for b in m.buckets] == [16] * 8 + [total - 128]  # every bucket full but the last
    assert m.numel == total and m.shapes() == dict(SHAPES)
    # "c" (40 elements) starts after a (70) and b (3): 7 fill bucket 4, then 16, 16 and 1
    pieces = [p for b in m.buckets for p in b.pieces if p.name == "c"]
    assert [(p.start, p.numel) for p in pieces] == [(0, 7), (7, 16), (23, 16), (39, 1)]
    whole = plan_buckets(SHAPES, torch.float32, 16 * 4, split=False)  # engines that need whole tensors
    assert all(p.whole for b in whole.buckets for p in b.pieces)
    assert [b.numel for b in whole.buckets] == [70, 3, 40, 25]


def test_a_stream_holds_one_bucket_and_reassembles_whole_tensors():
    g = torch.Generator().manual_seed(0)
    src = {n: torch.randn(s, generator=g) for n, s in SHAPES}
    stream = LocalWeightStream.of(src.items(), torch.bfloat16, 16 * 2)
    ptrs = {b.flat.data_ptr() for b in stream}
    assert len(ptrs) == 1  # one staging buffer, refilled per bucket: never two buckets at once
    got = dict(stream.items())
    assert got.keys() == src.keys()
    for n, t in src.items():
        assert got[n].dtype == torch.bfloat16 and torch.equal(got[n], t.to(torch.bfloat16))


def test_hf_worker_loads_the_trainers_stream_in_its_bf16_bucket_by_bucket(make_cfg):
    cfg = make_cfg("model.dtype=bfloat16", "trainer.batch_size=16", "trainer.mini_batch_size=16")
    trainer, worker = PolicyTrainer(cfg), build_rollout_worker(cfg)
    trainer.train_step(_scored_batch(cfg, worker))
    stream = trainer.weight_stream(bucket_bytes=64 * 1024)  # 64 KB: ~3 buckets, the embedding split
    assert len(stream.manifest.buckets) > 2 and stream.manifest.dtype == "bfloat16"
    assert any(not p.whole for b in stream.manifest.buckets for p in b.pieces)
    assert worker._flat is not None  # the HF worker keeps its parameters in one buffer
    worker.update_weights(stream, trainer.version)
    assert worker.version == 1
    for name, p in worker.model.named_parameters():
        master = dict(trainer.model.named_parameters())[name]
        assert p.dtype == torch.bfloat16 and torch.equal(p, master.detach().to(torch.bfloat16)), name
    # the buckets landed directly in the worker's parameters: the trainer needed no staging buffer
    assert trainer._staging.tensor is None
    # a receiver without its own memory to lend (the object store's sender side) uses one bucket
    assert sum(1 for _ in trainer.weight_stream(bucket_bytes=64 * 1024)) == len(stream.manifest.buckets)
    assert trainer._staging.tensor.numel() * 2 <= 64 * 1024


def test_flat_params_take_buckets_in_place_and_fall_back_when_the_order_differs():
    from rl_engine.weights.buckets import FlatParams, load_stream

    g = torch.Generator().manual_seed(2)
    module = torch.nn.Sequential(torch.nn.Linear(7, 10), torch.nn.Linear(10, 3))
    flat = FlatParams.of(module)
    params = dict(module.named_parameters())
    start, end = flat.flat.data_ptr(), flat.flat.data_ptr() + flat.flat.numel() * 4
    assert all(start <= p.data_ptr() < end for p in params.values())  # one buffer, same Parameters
    src = {n: torch.randn(p.shape, generator=g) for n, p in params.items()}
    stream = LocalWeightStream.of(src.items(), torch.float32, 4 * 16)
    assert all(flat.region(b, torch.float32) is not None for b in stream.manifest.buckets)
    load_stream(stream, params, flat)
    assert stream.staging.tensor is None  # written in place: no staging buffer was needed
    assert all(torch.equal(params[n], t) for n, t in src.items())
    backwards = LocalWeightStream.of(reversed([(n, t * 2) for n, t in src.items()]), torch.float32, 4 * 16)
    assert any(flat.region(b, torch.float32) is None for b in backwards.manifest.buckets)
    load_stream(backwards, params, flat)  # pieces that are not consecutive here: copied one by one
    assert all(torch.equal(params[n], t * 2) for n, t in src.items())


def test_a_bad_manifest_is_rejected_before_anything_is_copied(make_cfg):
    cfg = make_cfg()
    worker = build_rollout_worker(cfg)
    before = {k: p.detach().clone() for k, p in worker.model.named_parameters()}
    params = dict(worker.model.named_parameters())
    fake = {k: torch.zeros_like(p) for k, p in params.items()}
    bad_shape = dict(fake, **{"model.norm.weight": torch.zeros(3)})
    with pytest.raises(ValueError, match="has shape"):
        worker.update_weights(LocalWeightStream.of(bad_shape.items(), torch.float32, 4096), 5)
    with pytest.raises(KeyError, match="unknown parameter names"):
        worker.update_weights(
            LocalWeightStream.of([*fake.items(), ("nope", torch.zeros(2))], torch.float32, 4096), 5
        )
    assert worker.version == 0
    assert all(torch.equal(before[k], p) for k, p in worker.model.named_parameters())
    with pytest.raises(KeyError):
        check_against(plan_buckets([("nope", (1,))], torch.float32, 64), params)


@pytest.fixture(scope="module")
def local_ray():
    ray = pytest.importorskip("ray")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    tmp = tempfile.mkdtemp(prefix="rle_", dir="/tmp")
    ray.init(num_cpus=1, include_dashboard=False, _temp_dir=tmp)
    yield ray
    ray.shutdown()


def test_object_store_publishes_bucket_by_bucket_and_another_process_loads_them(local_ray):
    from rl_engine.weights.object_store import ObjectStoreWeights, publish_stream

    ray = local_ray

    @ray.remote(num_cpus=0)
    class Receiver:
        def load(self, box, shapes):
            stream = ray.get(box[0])
            assert isinstance(stream, ObjectStoreWeights)
            params = {n: torch.zeros(s, dtype=torch.bfloat16) for n, s in shapes.items()}
            check_against(stream.manifest, params)
            for bucket in stream:
                load_bucket(bucket, params)
            return {n: p.float().numpy() for n, p in params.items()}

    g = torch.Generator().manual_seed(1)
    src = {n: torch.randn(s, generator=g) for n, s in SHAPES}
    for size in (16 * 2, 4096):  # 9 buckets: one put each; one bucket: inline in one put
        stream = LocalWeightStream.of(src.items(), torch.bfloat16, size)
        outer, refs = publish_stream(stream)
        assert len(refs) == (len(stream.manifest.buckets) if size == 32 else 0)
        got = ray.get(Receiver.remote().load.remote([outer], dict(SHAPES)))
        for n, t in src.items():
            assert np.array_equal(got[n], t.to(torch.bfloat16).float().numpy()), n


_PEAK_PROBE = """
import gc, json, sys
from pathlib import Path
import torch
from safetensors.torch import load_file
from rl_engine.config import ModelConfig
from rl_engine.models import load_model
from rl_engine.weights.buckets import FlatParams

def status_mb(key):
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith(key + ":"))
    return int(line.split()[1]) / 1024

model = load_model(ModelConfig(path=sys.argv[1]))  # from_pretrained maps the safetensors file
gc.collect()
Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
base = status_mb("VmRSS")
flat = FlatParams.of(model)
peak = status_mb("VmHWM") - base
expected = load_file(str(Path(sys.argv[1]) / "model.safetensors"))
same = all(torch.equal(p, expected[n]) for n, p in model.named_parameters())
inside = all(
    flat.flat.data_ptr() <= p.data_ptr() < flat.flat.data_ptr() + flat.flat.numel() * 4
    for p in model.parameters()
)
print(json.dumps({"peak_extra_mb": peak, "same": same, "inside": inside}))
"""


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc")
def test_flat_params_of_a_loaded_model_never_hold_it_twice(tmp_path: Path):
    """A model just loaded maps its safetensors file: building the flat buffer must let each tensor's
    file pages go as it is copied, so the peak stays near one model (it was two)."""
    import subprocess
    import sys

    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=512,
        hidden_size=512,
        intermediate_size=2048,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    )
    model = Qwen2ForCausalLM(cfg)
    model_mb = sum(p.numel() * 4 for p in model.parameters()) / 2**20
    largest_mb = max(p.numel() * 4 for p in model.parameters()) / 2**20
    model.save_pretrained(tmp_path / "m")
    del model
    proc = subprocess.run(
        [sys.executable, "-c", _PEAK_PROBE, str(tmp_path / "m")],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
        # RSS follows live memory: freed buffers are unmapped, not kept by the C allocator
        env={**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"},
    )
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["same"] and out["inside"]
    # one model (the buffer) plus the tensor in flight, with slack for the interpreter's own growth
    assert out["peak_extra_mb"] <= model_mb + largest_mb + 0.1 * model_mb, (out, model_mb)
