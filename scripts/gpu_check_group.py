"""The trainer group on every GPU of this machine (NCCL, FSDP2), against one rank: prints one JSON line.

World size = the number of GPUs (one GPU: world size 1 through the group's code). Each rank trains a
Qwen2.5-0.5B-shaped random model (float32 master weights, bf16 autocast) for a few steps on the same
synthetic batches; rank 0 gathers the parameters, which must match a one-rank run on GPU 0 (float32
summation order aside: within 1% of a learning-rate step over the steps); then a weight stream from the
shards is timed. Reported per rank: peak GPU memory, step time. No Ray (the GPU machine has none).

    python scripts/gpu_check_group.py                      # every GPU
    python scripts/gpu_check_group.py --device cpu --quick --world 2   # the same code on CPU (gloo)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))  # the ranks import ``gpu_check_group:rank_run``

LR = 1e-4


def _cfg(model_dir: str, device: str) -> Any:
    from rl_engine.config import apply_overrides, parse_config
    from rl_engine.presets import get_preset

    data = get_preset("demo-cpu")
    data["model"] = {"path": model_dir, "dtype": "bfloat16" if device == "cuda" else "float32"}
    return parse_config(
        apply_overrides(
            data,
            [
                "trainer.batch_size=8",
                "trainer.mini_batch_size=4",
                "rollout.n=2",
                f"trainer.lr={LR}",
                f"trainer.precision={'bf16' if device == 'cuda' else 'fp32'}",
                "trainer.grad_clip=1.0",
            ],
        )
    )


def rank_run(ranks: Any, payload: dict[str, Any]) -> dict[str, Any]:
    """One rank: train the steps, report memory and time; rank 0 returns the gathered parameters."""
    import torch

    from rl_engine.trainer import PolicyTrainer

    device = payload["device"]
    dev = f"cuda:{ranks.rank}" if device == "cuda" else "cpu"
    trainer = PolicyTrainer(_cfg(payload["model_dir"], device), device=dev, ranks=ranks)
    times = []
    for samples in payload["steps"]:
        t0 = time.perf_counter()
        trainer.train_step(samples)
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    n = sum(1 for _ in trainer.weight_stream())
    sync_s = time.perf_counter() - t0
    weights = trainer.weights_numpy()
    return {
        "rank": ranks.rank,
        "step_s": statistics.median(times[1:] or times),
        "sync_s": sync_s,
        "sync_buckets": n,
        "peak_gpu_gib": torch.cuda.max_memory_allocated(dev) / 2**30 if device == "cuda" else None,
        "weights": weights if ranks.rank == 0 else None,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--world", type=int, default=None, help="ranks (default: every GPU; CPU: 2)")
    ap.add_argument("--quick", action="store_true", help="a small shape")
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()

    import numpy as np
    import torch

    from harness.trainer_group import spawn_group, synthetic_samples
    from rl_engine.models.shaped import save_shaped_model

    if args.device == "cuda" and not torch.cuda.is_available():
        print(json.dumps({"check": "trainer_group", "ok": False, "error": "no CUDA device"}))
        return 1
    world = args.world or (torch.cuda.device_count() if args.device == "cuda" else 2)
    shape = (
        {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "intermediate_size": 128, "vocab_size": 4096}
        if args.quick else {}
    )  # fmt: skip
    backend = "nccl" if args.device == "cuda" else "gloo"
    with tempfile.TemporaryDirectory(prefix="gpu_check_group_") as tmp:
        model_dir = str(save_shaped_model(Path(tmp) / "model", dtype="float32", **shape))
        vocab = shape.get("vocab_size", 151936)
        steps = [
            synthetic_samples(8, 2, vocab, seed=s, prompt_len=(16, 64), response_len=(16, 128))
            for s in range(args.steps)
        ]
        payload = {"model_dir": model_dir, "device": args.device, "steps": steps}
        t0 = time.perf_counter()
        group = spawn_group(world, "gpu_check_group:rank_run", payload, backend=backend, timeout_s=900)
        group_s = time.perf_counter() - t0
        one = spawn_group(1, "gpu_check_group:rank_run", payload, backend=backend, timeout_s=900)[0]
    ref, got = one.pop("weights"), group[0].pop("weights")
    diff = max(float(np.abs(ref[k] - got[k]).max()) for k in ref)
    # float32 compute: summation order only (1% of an LR step a step); bf16 autocast: kernels differ with
    # the micro-batch shapes, so 5%
    tolerance = (0.05 if args.device == "cuda" else 0.01) * LR * args.steps
    report = {
        "check": "trainer_group",
        "device": args.device,
        "world_size": world,
        "backend": backend,
        "ok": diff <= tolerance,
        "max_abs_diff_vs_one_rank": diff,
        "tolerance": tolerance,
        "group_wall_s": round(group_s, 1),
        "one_rank": {k: v for k, v in one.items() if k != "weights"},
        "ranks": [{k: v for k, v in r.items() if k != "weights"} for r in group],
    }
    print(json.dumps(report))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
