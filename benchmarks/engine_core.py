"""Engine-core benchmark: HF rollout worker vs bare ``model.generate``, trainer step vs a bare
forward/backward/AdamW loop, and the demo-cpu learning curve.

    .venv/bin/python benchmarks/engine_core.py            # all three parts
    .venv/bin/python benchmarks/engine_core.py --parts rollout,trainer --repeats 7

The machine is shared: each comparison interleaves its two contenders (A B A B ...) and reports the
median of the repeats, so load changes hit both sides alike; compare the ratios, not absolute figures.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rl_engine.config import ExperimentConfig, TinyModelSpec, apply_overrides, parse_config
from rl_engine.data import PromptStream
from rl_engine.models.batching import left_pad
from rl_engine.models.tiny import save_tiny_model
from rl_engine.presets import get_preset
from rl_engine.rewards import build_reward
from rl_engine.rollout.hf import HFRolloutWorker
from rl_engine.trainer import PolicyTrainer

SIZES = {  # name -> tiny model spec fields
    "tiny-88k": {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "intermediate_size": 128},
    "small-3M": {"hidden_size": 256, "num_layers": 4, "num_heads": 8, "intermediate_size": 512},
}


def _cfg(model_dir: Path, *overrides: str) -> ExperimentConfig:
    data = get_preset("demo-cpu")
    data["model"].pop("tiny")
    return parse_config(apply_overrides(data, [f"model.path={model_dir}", *overrides]))


def _interleaved(a, b, repeats: int) -> dict[str, float]:
    """Median wall and process-CPU seconds of a() and b(), in A B B A order after one warm-up each.

    CPU time (this process, all threads) is the steadier figure on a shared machine: time spent
    preempted by other processes is not charged to it.
    """
    a(), b()
    res: dict[str, list[float]] = {"a_wall": [], "b_wall": [], "a_cpu": [], "b_cpu": []}

    def timed(fn, key: str) -> None:
        w, c = time.perf_counter(), time.process_time()
        fn()
        res[f"{key}_wall"].append(time.perf_counter() - w)
        res[f"{key}_cpu"].append(time.process_time() - c)

    for i in range(repeats):
        order = [(a, "a"), (b, "b")] if i % 2 == 0 else [(b, "b"), (a, "a")]
        for fn, key in order:
            timed(fn, key)
    return {k: statistics.median(v) for k, v in res.items()}


def bench_rollout(model_dir: Path, repeats: int, threads: int, new_tokens: int) -> dict[str, float]:
    """New tokens/s of HFRolloutWorker.generate vs model.generate on the same 64 left-padded prompts."""
    cfg = _cfg(
        model_dir,
        f"rollout.max_new_tokens={new_tokens}",
        "rollout.micro_batch_size=64",
        f"rollout.num_threads={threads}",
        "rollout.chunk_tokens=4",
        "data.task=add",
    )
    worker = HFRolloutWorker(cfg.rollout, cfg.model, seed=0)
    prompts = PromptStream(cfg, worker.tokenizer).next_batch(8)
    model, special = worker.model, worker.special
    ids, mask = left_pad([p.token_ids for p in prompts for _ in range(8)], special.pad_id)
    counts = {"worker": 0, "bare": 0}

    def run_worker() -> None:
        counts["worker"] = sum(len(s.response_ids) for s in worker.generate(prompts, 8))

    def run_bare() -> None:
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=True,
                temperature=1.0,
                top_p=1.0,
                top_k=0,
                max_new_tokens=new_tokens,
                eos_token_id=special.eos_ids,
                pad_token_id=special.pad_id,
            )
        new = out[:, ids.shape[1] :]
        # Count up to and including the first eos, like the worker's response lengths.
        is_eos = torch.isin(new, torch.tensor(special.eos_ids))
        ended = is_eos.cumsum(1) - is_eos.long() > 0
        counts["bare"] = int((~ended).sum())

    t = _interleaved(run_worker, run_bare, repeats)
    w, b = counts["worker"], counts["bare"]
    return {
        "worker_tok_s": w / t["a_wall"],
        "bare_tok_s": b / t["b_wall"],
        "ratio_wall": (w / t["a_wall"]) / (b / t["b_wall"]),
        "ratio_cpu": (w / t["a_cpu"]) / (b / t["b_cpu"]),
    }


def _fixed_batch(cfg: ExperimentConfig, worker: HFRolloutWorker):
    samples = worker.generate(
        PromptStream(cfg, worker.tokenizer).next_batch(cfg.trainer.batch_size // cfg.rollout.n), cfg.rollout.n
    )
    for i, s in enumerate(samples):
        s.reward = float(i % 3 == 0)
    return samples


def bench_trainer(model_dir: Path, repeats: int, threads: int, new_tokens: int) -> dict[str, float]:
    """Seconds per trainer step (64 samples, one mini-batch) vs a bare forward/backward/AdamW step."""
    cfg = _cfg(
        model_dir,
        f"rollout.max_new_tokens={new_tokens}",
        f"trainer.num_threads={threads}",
        "data.task=add",
        "trainer.batch_size=64",
        "trainer.mini_batch_size=64",
    )
    worker = HFRolloutWorker(cfg.rollout, cfg.model, seed=0)
    samples = _fixed_batch(cfg, worker)
    trainer = PolicyTrainer(cfg)
    bare_model = PolicyTrainer(cfg).model  # an identical, independent copy
    opt = torch.optim.AdamW(bare_model.parameters(), lr=cfg.trainer.lr)
    batch = trainer.pack_samples(samples)
    adv = torch.randn(len(samples), 1)
    width = batch.response_mask.shape[1]

    def run_bare() -> None:
        opt.zero_grad(set_to_none=True)
        logits = bare_model(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            position_ids=batch.position_ids,
            use_cache=False,
        ).logits[:, -width - 1 : -1]
        logp = torch.log_softmax(logits.float(), -1).gather(-1, batch.response_ids.unsqueeze(-1)).squeeze(-1)
        m = batch.response_mask.float()
        loss = -(adv * logp * m).sum() / m.sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(bare_model.parameters(), 1.0)
        opt.step()

    torch.set_num_threads(threads)
    t = _interleaved(lambda: trainer.train_step(samples), run_bare, repeats)
    return {
        "trainer_s": t["a_wall"],
        "bare_s": t["b_wall"],
        "ratio_wall": t["b_wall"] / t["a_wall"],
        "ratio_cpu": t["b_cpu"] / t["a_cpu"],
        "tokens": int(batch.response_mask.sum()),
    }


def bench_learning(
    model_dir: Path, budget_s: float, seed: int, checkpoints: list[float]
) -> list[tuple[float, int, float]]:
    """demo-cpu (its own hyperparameters) driven in-process: (wall s, step, mean reward of last 10 steps)."""
    cfg = _cfg(model_dir, f"seed={seed}")
    worker, trainer = HFRolloutWorker(cfg.rollout, cfg.model, seed=cfg.seed), PolicyTrainer(cfg)
    stream, reward = PromptStream(cfg, worker.tokenizer), build_reward(cfg.reward)
    k = cfg.trainer.batch_size // cfg.rollout.n
    rewards: list[float] = []
    curve, pending = [], list(checkpoints)
    t0 = time.perf_counter()
    for step in range(cfg.trainer.total_steps):
        samples = worker.generate(stream.next_batch(k), cfg.rollout.n)
        for s in samples:
            s.reward = reward(s)
        rewards.append(statistics.fmean(s.reward for s in samples))
        trainer.train_step(samples)
        worker.update_weights(trainer.weights_numpy(), trainer.version)
        elapsed = time.perf_counter() - t0
        while pending and elapsed >= pending[0]:
            curve.append((pending.pop(0), step + 1, statistics.fmean(rewards[-10:])))
        if elapsed > budget_s or not pending:
            break
    return curve


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="rollout,trainer,learning")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--sizes", default=",".join(SIZES))
    ap.add_argument("--seeds", default="0,1,2", help="learning-curve seeds")
    ap.add_argument("--budget-s", type=float, default=180.0)
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    with tempfile.TemporaryDirectory() as tmp:
        dirs = {
            name: save_tiny_model(TinyModelSpec(**spec), Path(tmp) / name) for name, spec in SIZES.items()
        }
        if "rollout" in parts:
            print(
                f"\n## HF rollout vs bare model.generate (64 seqs, {args.new_tokens} new tokens, "
                f"{args.threads} threads, median of {args.repeats})"
            )
            print(f"{'model':10} {'worker tok/s':>13} {'bare tok/s':>11} {'ratio wall':>10} {'ratio cpu':>9}")
            for name in args.sizes.split(","):
                r = bench_rollout(dirs[name], args.repeats, args.threads, args.new_tokens)
                print(
                    f"{name:10} {r['worker_tok_s']:13.0f} {r['bare_tok_s']:11.0f} {r['ratio_wall']:10.2f} {r['ratio_cpu']:9.2f}"
                )
        if "trainer" in parts:
            print(
                f"\n## Trainer step vs bare forward/backward/AdamW (64 samples, {args.threads} threads, "
                f"median of {args.repeats})"
            )
            print(
                f"{'model':10} {'tokens':>7} {'trainer ms':>11} {'bare ms':>8} {'ratio wall':>10} {'ratio cpu':>9}"
            )
            for name in args.sizes.split(","):
                r = bench_trainer(dirs[name], args.repeats, args.threads, args.new_tokens)
                print(
                    f"{name:10} {r['tokens']:7d} {r['trainer_s'] * 1e3:11.1f} {r['bare_s'] * 1e3:8.1f} "
                    f"{r['ratio_wall']:10.2f} {r['ratio_cpu']:9.2f}"
                )
        if "learning" in parts:
            marks = [5.0, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0, 180.0]
            marks = [m for m in marks if m <= args.budget_s]
            print(
                "\n## demo-cpu learning curve, in-process worker + trainer (mean reward of the last 10 steps)"
            )
            print(f"{'seed':>4} " + " ".join(f"{int(m):>5}s" for m in marks))
            for seed in [int(s) for s in args.seeds.split(",")]:
                curve = bench_learning(dirs["tiny-88k"], args.budget_s, seed, marks)
                cells = [f"{r:.2f}@{st}" for _, st, r in curve]
                print(f"{seed:>4} " + " ".join(f"{c:>6}" for c in cells))


if __name__ == "__main__":
    main()
