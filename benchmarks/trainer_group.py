"""The FSDP2 trainer group on CPU (gloo): per-rank memory, step time and weight sync for 1, 2 and 3 ranks.

A Qwen2.5-0.5B-shaped model (494M parameters, random weights; Qwen2 architecture, 151,936-token vocabulary)
with float32 master weights and AdamW, trained by ``PolicyTrainer`` on 1, 2 or 3 ranks in local processes
(``harness.trainer_group``, the same trainer the Ray group runs). Per rank it reports:

- ``state_gib``: the bytes of this rank's parameters + gradients + AdamW state after a step (counted from
  the tensors it holds: a rank's shards when sharded); the goal is <= 1/N + 10% of the one-rank figure;
- ``peak_rss_gib``: the process's peak resident memory (activations, allocator and libraries included);
- ``step_s``: median trainer-step time on the same batch (the machine has 2 cores: N ranks share them);
- weight sync: time for rank 0 to stream every bucket in the rollout dtype (bf16), each copied out as
  bytes as the object-store sync does (``sync_s``), and the sending rank's extra peak memory while it
  does: ``sync_live_mib`` counts the live gathered parameter + the staging bucket (exact), and
  ``sync_rss_mib`` is the resident-memory rise sampled every 2 ms (noisy).

    .venv/bin/python benchmarks/trainer_group.py            # full: 0.5B shape, 1, 2 and 3 ranks (~10 GB)
    .venv/bin/python benchmarks/trainer_group.py --quick    # a small shape, 1 and 2 ranks (seconds)
    .venv/bin/python benchmarks/trainer_group.py --smoke    # small, 2 ranks, one step: a check that it runs

Run the full mode alone: one rank holds ~8 GB (2 GB parameters, 2 GB gradients, 4 GB AdamW state).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))  # the ranks' processes import ``trainer_group:measure`` from here

GIB = 2**30


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def _tensor_bytes(t: Any) -> int:
    local = getattr(t, "_local_tensor", t)  # a DTensor: this rank's shard
    return local.numel() * local.element_size()


def state_bytes(trainer: Any) -> int:
    """This rank's parameters + gradients + optimizer state, in bytes."""
    total = 0
    for p in trainer.model.parameters():
        total += _tensor_bytes(p)
        if p.grad is not None:
            total += _tensor_bytes(p.grad)
    for st in trainer.optimizer.state.values():
        total += sum(_tensor_bytes(v) for v in st.values() if hasattr(v, "numel") and v.numel() > 1)
    return total


class _RssPeak:
    """Samples resident memory every 2 ms on a thread; ``peak - base`` is the rise."""

    def __enter__(self) -> _RssPeak:
        self.base = self.peak = _rss()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _rss())
            time.sleep(0.002)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, _rss())


def measure(ranks: Any, payload: dict[str, Any]) -> dict[str, float]:
    """One rank's figures (the target ``spawn_group`` runs in each rank's process)."""
    from harness.trainer_group import synthetic_samples
    from rl_engine.config import apply_overrides, parse_config
    from rl_engine.presets import get_preset
    from rl_engine.trainer import PolicyTrainer

    data = get_preset("demo-cpu")
    data["model"] = {"path": payload["model_dir"], "dtype": "bfloat16"}
    cfg = parse_config(apply_overrides(data, payload["overrides"]))
    trainer = PolicyTrainer(cfg, ranks=ranks)
    vocab = trainer.model.get_output_embeddings().weight.shape[0]
    batch = synthetic_samples(
        cfg.trainer.batch_size, cfg.rollout.n, vocab, seed=0, prompt_len=(16, 32), response_len=(16, 48)
    )
    times = []
    for i in range(payload["steps"] + 1):
        t0 = time.perf_counter()
        trainer.train_step(batch)
        if i:  # the first step allocates the AdamW state
            times.append(time.perf_counter() - t0)
    state = state_bytes(trainer)
    trainer.optimizer.zero_grad(set_to_none=True)  # the sync never needs gradients

    bucket_max = 0
    stream = trainer.weight_stream(split=True)
    t0 = time.perf_counter()
    with _RssPeak() as rss:
        for bucket in stream:
            bucket_max = max(bucket_max, bucket.flat.numel() * bucket.flat.element_size())
            if ranks.rank == 0:
                bucket.to_bytes()  # what the object-store sync copies out
    sync_s = time.perf_counter() - t0
    ranks.barrier("after the sync")
    return {
        "rank": ranks.rank,
        "state_gib": state / GIB,
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB,
        "step_s": statistics.median(times) if times else float("nan"),  # --steps 0: the warm-up step only
        "sync_s": sync_s,
        # beyond its shards: what the stream's source held at once (a parameter gathered whole or a
        # slice of rows received; 0 at one rank) + the bucket
        "sync_live_mib": (getattr(stream.source, "peak_bytes", 0) + bucket_max) / 2**20,
        "sync_rss_mib": (rss.peak - rss.base) / 2**20,
        "params": sum(p.numel() for p in trainer.model.parameters()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a small shape, 1 and 2 ranks")
    ap.add_argument("--smoke", action="store_true", help="a small shape, 2 ranks, one step")
    ap.add_argument("--worlds", default=None, help="comma-separated rank counts (default 1,2,3; quick 1,2)")
    ap.add_argument(
        "--steps",
        type=int,
        default=2,
        help="timed trainer steps after a warm-up step (0: none; the memory and sync figures only)",
    )
    args = ap.parse_args()
    if args.smoke:  # the code paths of the full run at tiny sizes (run_all.py --smoke): figures mean nothing
        args.quick, args.steps, args.worlds = True, 0, args.worlds or "2"

    from harness.trainer_group import spawn_group
    from rl_engine.models.shaped import save_shaped_model

    worlds = [int(w) for w in (args.worlds or ("1,2" if args.quick else "1,2,3")).split(",")]
    shape = (
        {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "intermediate_size": 128, "vocab_size": 4096}
        if args.quick else {}
    )  # fmt: skip
    overrides = [
        "trainer.batch_size=4",
        "trainer.mini_batch_size=4",
        "rollout.n=2",
        "trainer.precision=fp32",
        "trainer.num_threads=1",
        "trainer.weight_sync_bucket_mb=64",
        "trainer.collective_timeout_s=1800",
    ]
    with tempfile.TemporaryDirectory(prefix="bench_group_") as tmp:
        model_dir = str(save_shaped_model(Path(tmp) / "model", dtype="float32", **shape))
        results = {}
        for world in worlds:
            payload = {"model_dir": model_dir, "overrides": overrides, "steps": args.steps}
            ranks = spawn_group(world, "trainer_group:measure", payload, timeout_s=3600)
            results[world] = ranks
            print(json.dumps({"world": world, "ranks": ranks}), flush=True)
    one = results[worlds[0]][0] if worlds[0] == 1 else None
    print("\nworld  rank  state GiB  (goal)  peak RSS GiB  step s  sync s  sync live MiB  sync RSS MiB")
    for world, ranks in results.items():
        for r in ranks:
            goal = f"{one['state_gib'] * (1 / world + 0.10):.2f}" if one else "-"
            print(
                f"{world:5d}  {r['rank']:4d}  {r['state_gib']:9.3f}  {goal:>6}  {r['peak_rss_gib']:12.2f}  "
                f"{r['step_s']:6.2f}  {r['sync_s']:6.2f}  {r['sync_live_mib']:13.1f}  {r['sync_rss_mib']:12.1f}"
            )


if __name__ == "__main__":
    main()
