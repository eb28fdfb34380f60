"""The engine on one device, in one process (no Ray): a Qwen2.5-0.5B-shaped random model in bf16.

Run through ``scripts/gpu_check.sh`` (``--device cpu --quick`` runs the same code paths on a small
shape, on CPU). Needs only torch, transformers, pydantic, numpy and pyyaml. Prints one JSON object:

* ``logprobs``: the HF rollout worker's behaviour log-probs against the trainer's recomputation of the
  same samples on the same weights (bf16 on both sides, different kernels: KV-cache decode vs one
  forward);
* ``step``: one trainer step (fp32 master weights, bf16 autocast, chunked output layer): time and peak
  device memory above what was allocated before it;
* ``rollout``: new tokens/s of the HF worker's decode loop against bare ``model.generate`` on the same
  prompts, eos disabled so both do the same work;
* ``sync``: a streamed weight sync trainer -> worker against a bare ``load_state_dict``;
* ``driver``: a few RL steps through the in-process loop (generate, score, train, sync).

Exits 1 when a check in ``checks`` failed (``ok`` false), naming it on stderr.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

FULL = {"prompts": 32, "n": 4, "new_tokens": 256, "mini_batch": 64, "bench_seqs": 64, "bench_tokens": 128}
QUICK = {"prompts": 8, "n": 2, "new_tokens": 16, "mini_batch": 8, "bench_seqs": 16, "bench_tokens": 16}
QUICK_SHAPE = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
}  # the real 151,936-token vocabulary: the chunked path is exercised


class Clock:
    """Wall time of a block, synchronising the device first and last (CUDA work is asynchronous)."""

    def __init__(self, device: str) -> None:
        self.device = device

    def __call__(self, fn, *args: Any, **kwargs: Any) -> tuple[Any, float]:
        import torch

        sync = torch.cuda.synchronize if self.device == "cuda" else (lambda: None)
        sync()
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        sync()
        return out, time.perf_counter() - t0


def build(model_dir: Path, device: str, size: dict[str, int]):
    from rl_engine.backends.hf.worker import HFRolloutWorker
    from rl_engine.config import apply_overrides, parse_config
    from rl_engine.presets import get_preset
    from rl_engine.trainer import PolicyTrainer

    batch = size["prompts"] * size["n"]
    data = get_preset("demo-cpu")
    data["model"] = {"path": str(model_dir), "dtype": "bfloat16"}
    cfg = parse_config(
        apply_overrides(
            data,
            [
                f"rollout={{backend: hf, n: {size['n']}, max_new_tokens: {size['new_tokens']}, micro_batch_size: {batch},"
                f" device: {device}, num_threads: 2}}",
                f"trainer.batch_size={batch}",
                f"trainer.mini_batch_size={size['mini_batch']}",
                f"trainer.device={device}",
                "trainer.num_threads=2",
                "trainer.lr=1e-6",
                "resources.rollout_gpus=1",
                "resources.trainer_gpus=1",
                "data.task=add",
            ],
        )
    )
    return cfg, HFRolloutWorker(cfg.rollout, cfg.model, gpus=1), PolicyTrainer(cfg)


def check_logprobs(cfg, worker, trainer, clock: Clock) -> tuple[list[Any], dict[str, Any]]:
    from rl_engine.data import PromptStream

    prompts = PromptStream(cfg, worker.tokenizer).next_batch(cfg.trainer.batch_size // cfg.rollout.n)
    samples, gen_s = clock(worker.generate, prompts, cfg.rollout.n)
    recomputed = trainer.compute_logprobs(samples)
    diffs = sorted(
        abs(a - b)
        for s, r in zip(samples, recomputed, strict=True)
        for a, b in zip(s.logprobs, r, strict=True)
    )
    return samples, {
        "tokens": len(diffs),
        "generate_s": gen_s,
        "mean_abs_diff": statistics.fmean(diffs),
        "p99_abs_diff": diffs[int(0.99 * (len(diffs) - 1))],
        "max_abs_diff": diffs[-1],
    }


def check_step(samples: list[Any], trainer, clock: Clock, device: str) -> dict[str, Any]:
    import torch

    for i, s in enumerate(samples):
        s.reward = float(i % 2)  # a random model earns no reward: a fixed rule gives non-zero advantages
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    metrics, seconds = clock(trainer.train_step, samples)
    out = {
        "seconds": seconds,
        "tokens": sum(len(s.prompt_ids) + len(s.response_ids) for s in samples),
        "optimizer_steps": metrics["trainer/optimizer_steps"],
        "grad_norm": metrics["actor/grad_norm"],
        "pg_loss": metrics["actor/pg_loss"],
        "micro_batch_token_budget": trainer.max_tokens,
        "logits_chunk_tokens": trainer.chunk_tokens,
    }
    if device == "cuda":
        out["peak_extra_gb"] = (torch.cuda.max_memory_allocated() - before) / 2**30
        out["allocated_gb"] = torch.cuda.memory_allocated() / 2**30
    return out


def check_rollout(cfg, clock: Clock, size: dict[str, int], repeats: int = 2) -> dict[str, Any]:
    """A worker whose eos id lies outside the vocabulary, so it and ``generate`` both decode every step."""
    import torch

    from rl_engine.backends.hf.worker import HFRolloutWorker
    from rl_engine.data import PromptStream
    from rl_engine.models.batching import left_pad

    vocab = json.loads((Path(cfg.model.path) / "config.json").read_text())["vocab_size"]
    model_cfg = cfg.model.model_copy(update={"generation_config": {"eos_token_id": vocab}})
    rollout_cfg = cfg.rollout.model_copy(
        update={"max_new_tokens": size["bench_tokens"], "micro_batch_size": size["bench_seqs"]}
    )
    worker = HFRolloutWorker(rollout_cfg, model_cfg, gpus=1)
    prompts = PromptStream(cfg, worker.tokenizer).next_batch(size["bench_seqs"])
    ids, mask = left_pad([p.token_ids for p in prompts], worker.special.pad_id)
    ids, mask = ids.to(worker.device), mask.to(worker.device)
    tokens = size["bench_seqs"] * size["bench_tokens"]

    def bare() -> None:
        with torch.no_grad():
            worker.model.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=True,
                top_k=0,
                top_p=1.0,
                temperature=1.0,
                max_new_tokens=size["bench_tokens"],
                eos_token_id=vocab,
                pad_token_id=worker.special.pad_id,
            )

    def ours() -> None:
        assert sum(len(s.response_ids) for s in worker.generate(prompts, 1)) == tokens

    runs: dict[str, list[float]] = {"worker": [], "bare": []}
    clock(bare), clock(ours)  # warm-up
    for i in range(repeats):
        for name, fn in (
            (("worker", ours), ("bare", bare)) if i % 2 == 0 else (("bare", bare), ("worker", ours))
        ):
            runs[name].append(clock(fn)[1])
    w, b = statistics.median(runs["worker"]), statistics.median(runs["bare"])
    return {
        "sequences": size["bench_seqs"],
        "new_tokens": size["bench_tokens"],
        "worker_tok_s": tokens / w,
        "bare_tok_s": tokens / b,
        "ratio": b / w,
    }


def check_sync(worker, trainer, clock: Clock, repeats: int = 3) -> dict[str, Any]:
    import torch

    params = dict(worker.model.named_parameters())
    state = {k: v for k, v in trainer.model.state_dict().items() if k in params}
    runs: dict[str, list[float]] = {"stream": [], "bare": []}
    for i in range(repeats):
        for name in ("stream", "bare") if i % 2 == 0 else ("bare", "stream"):
            if name == "stream":
                runs[name].append(clock(worker.update_weights, trainer.weight_stream(), trainer.version)[1])
            else:
                runs[name].append(clock(worker.model.load_state_dict, state, strict=False)[1])
    worker.update_weights(trainer.weight_stream(), trainer.version)
    master = dict(trainer.model.named_parameters())
    exact = all(torch.equal(p, master[k].detach().to(p.dtype)) for k, p in params.items())
    s, b = statistics.median(runs["stream"]), statistics.median(runs["bare"])
    return {
        "buckets": len(trainer.weight_stream().manifest.buckets),
        "stream_s": s,
        "bare_load_state_dict_s": b,
        "ratio": s / b,
        "exact": exact,
    }


def run_driver(cfg, worker, trainer, clock: Clock, steps: int) -> dict[str, Any]:
    """The in-process loop: generate -> score -> train -> sync, ``steps`` times."""
    from rl_engine.data import PromptStream
    from rl_engine.rewards import build_reward

    stream, reward = PromptStream(cfg, worker.tokenizer), build_reward(cfg.reward)
    timings = []
    for _ in range(steps):
        samples, gen_s = clock(
            worker.generate, stream.next_batch(cfg.trainer.batch_size // cfg.rollout.n), cfg.rollout.n
        )
        for i, s in enumerate(samples):
            s.reward = reward(s) + float(i % 2)
        _, train_s = clock(trainer.train_step, samples)
        _, sync_s = clock(worker.update_weights, trainer.weight_stream(), trainer.version)
        timings.append({"generate_s": gen_s, "train_s": train_s, "sync_s": sync_s})
    return {"steps": steps, "worker_version": worker.version, "per_step": timings}


def _stage(name: str, fn, *args: Any) -> Any:
    print(f"gpu_check: {name} ...", file=sys.stderr, flush=True)
    return fn(*args)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--quick", action="store_true", help="a small model and batch (any device)")
    ap.add_argument("--driver-steps", type=int, default=2)
    args = ap.parse_args()
    import torch
    import transformers
    from transformers.utils import logging as hf_logging

    from rl_engine.models.shaped import QWEN25_05B, save_shaped_model

    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit(
            "gpu_check: no CUDA device visible (run with --device cpu --quick to check the code paths on CPU)"
        )
    hf_logging.disable_progress_bar()
    size, shape = (QUICK, QUICK_SHAPE) if args.quick else (FULL, {})
    t0, clock = time.perf_counter(), Clock(args.device)
    out: dict[str, Any] = {
        "device": args.device,
        "quick": args.quick,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "gpu": torch.cuda.get_device_name() if args.device == "cuda" else None,
        "shape": {**QWEN25_05B, **shape},
    }
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:
        cfg, worker, trainer = build(save_shaped_model(Path(tmp) / "model", **shape), args.device, size)
        out["params_m"] = sum(p.numel() for p in trainer.model.parameters()) / 1e6
        samples, out["logprobs"] = _stage("logprobs", check_logprobs, cfg, worker, trainer, clock)
        out["step"] = _stage("step", check_step, samples, trainer, clock, args.device)
        out["sync"] = _stage("sync", check_sync, worker, trainer, clock)
        out["driver"] = _stage("driver", run_driver, cfg, worker, trainer, clock, args.driver_steps)
        del worker
        out["rollout"] = _stage("rollout", check_rollout, cfg, clock, size)
    out["checks"] = {
        "logprobs_agree": out["logprobs"]["mean_abs_diff"] < 0.05,
        "step_finite": all(v == v for v in (out["step"]["grad_norm"], out["step"]["pg_loss"])),
        "sync_exact": out["sync"]["exact"],
        "worker_follows_trainer": out["driver"]["worker_version"] == trainer.version,
    }
    out["ok"], out["seconds"] = all(out["checks"].values()), time.perf_counter() - t0
    print(json.dumps(out, default=float))
    if not out["ok"]:  # a failed check fails the command (scripts/gpu_check.sh, make check-floor)
        failed = [name for name, passed in out["checks"].items() if not passed]
        print(f"gpu_check: failed: {', '.join(failed)}", file=sys.stderr)
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
