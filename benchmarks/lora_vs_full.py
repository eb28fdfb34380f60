"""LoRA against full fine-tuning on one trainer: memory, step time, weight sync, checkpoint, generation.

The same trainer (``PolicyTrainer``, one rank, float32 master weights, AdamW) on the same batch, once
training every weight and once training LoRA adapters (``model.lora``: rank 16, alpha 32, every linear
layer but the output layer), each in a fresh process (``harness.trainer_group.spawn_group`` with one
rank), so that peak memory is that mode's alone. Per mode it reports:

- ``trainable``: parameters AdamW holds; ``state_mib``: parameters + gradients + AdamW state after a
  step (counted from the tensors); ``peak_rss_mib``: the process's peak resident memory;
- ``step_s``: median trainer-step time on the same batch after a warm-up step;
- ``sync_mib`` / ``sync_s``: what one weight sync moves (the manifest's bytes in the rollout dtype) and
  the time to stream every bucket out as bytes (what the object-store sync copies);
- ``ckpt_mib`` / ``ckpt_s``: one checkpoint's size on disk and its write time;
- ``maxdiff``: after that sync, the HF rollout worker's behaviour log-probs against the trainer's
  recomputation, max abs difference over 4 responses of up to 64 tokens;
- ``gen_s``: the HF rollout worker decoding 16 x 64 tokens with the adapters applied as a peft model
  (``lora``) or with plain weights (``full``: what merged adapters would cost), median of 2.

    .venv/bin/python benchmarks/lora_vs_full.py                 # SmolLM2-135M (make model), ~10 min
    .venv/bin/python benchmarks/lora_vs_full.py --model shaped-0.5b --batch-size 8 --steps 1
                                                                # Qwen2.5-0.5B's shape, random weights
    .venv/bin/python benchmarks/lora_vs_full.py --smoke         # a tiny model, one step: a check that it runs

Run it alone on the machine: two cores shared with anything else make the times meaningless.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))  # the measuring process imports ``lora_vs_full:measure`` from here

MIB = 2**20
SMOLLM2 = "var/models/smollm2-135m-instruct"
LORA = "model.lora={rank: 16, alpha: 32}"


def _tensor_bytes(t: Any) -> int:
    return t.numel() * t.element_size()


def state_bytes(trainer: Any) -> int:
    """Parameters + gradients + AdamW state held by the trainer, in bytes."""
    total = sum(
        _tensor_bytes(p) + (_tensor_bytes(p.grad) if p.grad is not None else 0)
        for p in trainer.model.parameters()
    )
    for st in trainer.optimizer.state.values():
        total += sum(_tensor_bytes(v) for v in st.values() if hasattr(v, "numel") and v.numel() > 1)
    return total


def _config(payload: dict[str, Any]) -> Any:
    from rl_engine.config import apply_overrides, parse_config
    from rl_engine.presets import get_preset

    data = get_preset("smollm2-arith-cpu")
    data["model"] = {"path": payload["model_dir"]}
    data.pop("data"), data.pop("reward"), data.pop("eval")
    return parse_config(apply_overrides(data, payload["overrides"]))


def measure(ranks: Any, payload: dict[str, Any]) -> dict[str, float]:
    """One mode's figures, in a process of its own (the target ``spawn_group`` runs)."""
    from harness.trainer_group import synthetic_samples
    from rl_engine.backends import build_rollout_worker
    from rl_engine.trainer import PolicyTrainer

    cfg = _config(payload)
    trainer = PolicyTrainer(cfg, ranks=ranks)
    vocab = trainer.model.get_output_embeddings().weight.shape[0]
    batch = synthetic_samples(
        cfg.trainer.batch_size,
        cfg.rollout.n,
        vocab,
        seed=0,
        prompt_len=payload["prompt"],
        response_len=payload["response"],
    )
    times = []
    for i in range(payload["steps"] + 1):
        t0 = time.perf_counter()
        trainer.train_step(batch)
        if i:  # the first step allocates the AdamW state
            times.append(time.perf_counter() - t0)
    state = state_bytes(trainer)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    trainer.optimizer.zero_grad(set_to_none=True)

    stream = trainer.weight_stream()
    t0 = time.perf_counter()
    for bucket in stream:
        bucket.to_bytes().copy()  # what the object-store sync copies out
    sync_s = time.perf_counter() - t0

    # after the sync, the rollout worker's behaviour log-probs against the trainer's recomputation
    worker = build_rollout_worker(cfg)
    worker.update_weights(trainer.weight_stream(), 1)
    answered = worker.generate(_prompts(max(1, payload["gen"] // 4), 32), 1)
    recomputed = trainer.compute_logprobs(answered)
    diff = max(
        abs(a - b)
        for s, r in zip(answered, recomputed, strict=True)
        for a, b in zip(s.logprobs, r, strict=True)
    )
    del worker

    with tempfile.TemporaryDirectory(prefix="bench_lora_ckpt_") as tmp:
        t0 = time.perf_counter()
        trainer.save_checkpoint(Path(tmp) / "step", {})
        ckpt_s = time.perf_counter() - t0
        ckpt_bytes = sum(f.stat().st_size for f in (Path(tmp) / "step").rglob("*") if f.is_file())
    return {
        "trainable": sum(p.numel() for p in trainer.model.parameters() if p.requires_grad),
        "params": sum(p.numel() for p in trainer.model.parameters()),
        "state_mib": state / MIB,
        "peak_rss_mib": peak / MIB,
        "step_s": statistics.median(times) if times else float("nan"),
        "sync_mib": stream.manifest.nbytes / MIB,
        "sync_s": sync_s,
        "ckpt_mib": ckpt_bytes / MIB,
        "ckpt_s": ckpt_s,
        "sync_logprob_maxdiff": diff,
    }


def _prompts(count: int, length: int) -> list[Any]:
    from rl_engine.types import Prompt

    return [
        Prompt(
            uid=f"p{i}", token_ids=[1 + (7 * i + j) % 500 for j in range(length)], text="", answer="", index=i
        )
        for i in range(count)
    ]


def generate(ranks: Any, payload: dict[str, Any]) -> dict[str, float]:
    """The HF rollout worker decoding ``gen`` sequences of ``gen_tokens`` tokens, median of 2 calls."""
    from rl_engine.backends import build_rollout_worker

    cfg = _config(payload)
    worker = build_rollout_worker(cfg)
    worker.min_new_tokens = payload["gen_tokens"]  # decode the whole budget: no early eos
    prompts = _prompts(payload["gen"], 32)
    worker.generate(prompts[:1], 1)  # warm-up
    times = []
    for _ in range(2):
        t0 = time.perf_counter()
        worker.generate(prompts, 1)
        times.append(time.perf_counter() - t0)
    return {"gen_s": statistics.median(times)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=SMOLLM2, help=f"a model directory, or shaped-0.5b (default {SMOLLM2})")
    ap.add_argument(
        "--smoke", action="store_true", help="a tiny random model, one step: a check that it runs"
    )
    ap.add_argument("--steps", type=int, default=2, help="timed trainer steps after a warm-up step")
    ap.add_argument("--batch-size", type=int, default=32, help="samples per trainer step (rollout.n 8)")
    args = ap.parse_args()

    from harness.trainer_group import spawn_group
    from rl_engine.models.shaped import save_shaped_model

    base = ["trainer.num_threads=2", "rollout.num_threads=2", "rollout.max_new_tokens=64"]
    base += [f"trainer.batch_size={args.batch_size}", f"trainer.mini_batch_size={args.batch_size}"]
    payload: dict[str, Any] = {
        "steps": args.steps,
        "prompt": (48, 96),
        "response": (16, 64),
        "gen": 16,
        "gen_tokens": 64,
    }
    tmp = Path(tempfile.mkdtemp(prefix="bench_lora_"))
    try:
        if (
            args.smoke
        ):  # the code paths of the full run at tiny sizes (run_all.py --smoke): figures mean nothing
            shape = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                     "intermediate_size": 128, "vocab_size": 4096}  # fmt: skip
            payload.update(steps=1, prompt=(4, 8), response=(2, 8), gen=2, gen_tokens=4)
            model_dir = str(save_shaped_model(tmp / "model", dtype="float32", **shape))
        elif args.model == "shaped-0.5b":
            model_dir = str(save_shaped_model(tmp / "model", dtype="float32"))
        else:
            model_dir = args.model
            if not (Path(model_dir) / "config.json").exists():
                sys.exit(f"{model_dir}: no model there (make model fetches SmolLM2-135M-Instruct)")
        results = {}
        for mode, extra in (("full", []), ("lora", [LORA])):
            job = {**payload, "model_dir": model_dir, "overrides": base + extra}
            figures = spawn_group(1, "lora_vs_full:measure", job, timeout_s=3600)[0]
            figures.update(spawn_group(1, "lora_vs_full:generate", job, timeout_s=3600)[0])
            results[mode] = figures
            print(json.dumps({"mode": mode, **figures}), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(
        "\nmode  trainable      state MiB  peak RSS MiB  step s  sync MiB  sync s  ckpt MiB  ckpt s  gen s  maxdiff"
    )
    for mode, r in results.items():
        print(
            f"{mode:4}  {r['trainable']:11,d}  {r['state_mib']:9.1f}  {r['peak_rss_mib']:12.0f}  {r['step_s']:6.2f}  "
            f"{r['sync_mib']:8.2f}  {r['sync_s']:6.3f}  {r['ckpt_mib']:8.1f}  {r['ckpt_s']:6.2f}  {r['gen_s']:5.2f}  "
            f"{r['sync_logprob_maxdiff']:.1e}"
        )


if __name__ == "__main__":
    main()
