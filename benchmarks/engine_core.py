"""Engine-core benchmark: HF rollout worker vs bare ``model.generate``, trainer step vs a bare
forward/backward/AdamW loop, and the demo-cpu learning curve.

    .venv/bin/python benchmarks/engine_core.py            # all three parts
    .venv/bin/python benchmarks/engine_core.py --parts rollout,trainer --repeats 7
    .venv/bin/python benchmarks/engine_core.py --quick    # rollout and trainer, small (``make bench``)
    .venv/bin/python benchmarks/engine_core.py --smoke    # every part, tiny and once: a check that it runs

The machine is shared: each comparison interleaves its two contenders (A B A B ...) and reports the
median of the repeats, so load changes hit both sides alike; compare the ratios, not absolute figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rl_engine.backends.hf.worker import HFRolloutWorker
from rl_engine.config import ExperimentConfig, TinyModelSpec, apply_overrides, parse_config
from rl_engine.data import PromptStream
from rl_engine.models.batching import left_pad
from rl_engine.models.tiny import save_tiny_model
from rl_engine.presets import get_preset
from rl_engine.rewards import build_reward
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
    """New tokens/s of HFRolloutWorker.generate vs model.generate on the same 64 left-padded prompts.

    eos is set to an id outside the vocabulary for both, so every sequence runs exactly
    ``new_tokens`` steps: the two sides do identical work and the token counts carry no sampling noise.
    """
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    cfg = _cfg(
        model_dir,
        f"rollout.max_new_tokens={new_tokens}",
        "rollout.micro_batch_size=64",
        f"rollout.num_threads={threads}",
        "rollout.chunk_tokens=4",
        "data.task=add",
        f"model.generation_config={{eos_token_id: {vocab}}}",
    )
    worker = HFRolloutWorker(cfg.rollout, cfg.model, seed=0)
    prompts = PromptStream(cfg, worker.tokenizer).next_batch(8)
    model, special = worker.model, worker.special
    ids, mask = left_pad([p.token_ids for p in prompts for _ in range(8)], special.pad_id)
    tokens = len(prompts) * 8 * new_tokens

    def run_worker() -> None:
        assert sum(len(s.response_ids) for s in worker.generate(prompts, 8)) == tokens

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
        assert out.shape[1] - ids.shape[1] == new_tokens

    t = _interleaved(run_worker, run_bare, repeats)
    return {
        "worker_tok_s": tokens / t["a_wall"],
        "bare_tok_s": tokens / t["b_wall"],
        "ratio_wall": t["b_wall"] / t["a_wall"],
        "ratio_cpu": t["b_cpu"] / t["a_cpu"],
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
    model_dir: Path, budget_s: float, seed: int, marks: list[float], steps: int | None = None
) -> dict[str, object]:
    """demo-cpu (its own hyperparameters) driven in-process, worker then trainer, one step at a time.

    Returns the mean reward of the last 10 steps at each wall-time mark, the wall time and step at
    which that running mean first reached 0.5 / 0.8 / 0.9, and the step rate. Stops at 0.9 or the budget.
    """
    cfg = _cfg(model_dir, f"seed={seed}", *([f"trainer.total_steps={steps}"] if steps else []))
    worker, trainer = HFRolloutWorker(cfg.rollout, cfg.model, seed=cfg.seed), PolicyTrainer(cfg)
    stream, reward = PromptStream(cfg, worker.tokenizer), build_reward(cfg.reward)
    k = cfg.trainer.batch_size // cfg.rollout.n
    rewards: list[float] = []
    at_mark: dict[float, float] = {}
    reached: dict[float, tuple[float, int]] = {}
    t0 = time.perf_counter()
    for step in range(1, cfg.trainer.total_steps + 1):
        samples = worker.generate(stream.next_batch(k), cfg.rollout.n)
        for s in samples:
            s.reward = reward(s)
        rewards.append(statistics.fmean(s.reward for s in samples))
        trainer.train_step(samples)
        worker.update_weights(trainer.weights_numpy(), trainer.version)
        elapsed, running = time.perf_counter() - t0, statistics.fmean(rewards[-10:])
        for m in marks:
            if elapsed >= m and m not in at_mark:
                at_mark[m] = running
        for level in (0.5, 0.8, 0.9):
            if running >= level and level not in reached:
                reached[level] = (elapsed, step)
        if 0.9 in reached or elapsed > budget_s:
            break
    elapsed = time.perf_counter() - t0
    return {
        "at_mark": at_mark,
        "reached": reached,
        "steps_per_s": step / elapsed,
        "first10": statistics.fmean(rewards[:10]),
    }


def bench_learning_pipeline(
    model_dir: Path, budget_s: float, seed: int, marks: list[float], steps: int | None = None
) -> dict[str, object]:
    """demo-cpu as `python -m rl_engine train` runs it (the pipeline, its preset mode), timed from the
    call (Ray start included); reward = running mean of the last 10 steps' ``reward/mean``."""
    from rl_engine.pipeline import run_experiment
    from rl_engine.sinks import MetricsSink

    class Recorder(MetricsSink):
        def __init__(self) -> None:
            self.t0 = time.perf_counter()
            self.points: list[tuple[float, int, float]] = []

        def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
            if "reward/mean" in metrics:
                self.points.append((time.perf_counter() - self.t0, step, metrics["reward/mean"]))
                if len(self.points) >= 10 and statistics.fmean(p[2] for p in self.points[-10:]) >= 0.9:
                    stop.set()  # learned: stop the run early

    cfg = _cfg(
        model_dir,
        f"seed={seed}",
        "logging.log_every=1",
        "logging.samples_per_step=0",
        *([f"trainer.total_steps={steps}"] if steps else []),
    )
    stop = threading.Event()
    rec = Recorder()
    timer = threading.Timer(budget_s, stop.set)
    timer.start()
    try:
        run_experiment(cfg, rec, stop_event=stop)
    finally:
        timer.cancel()
    at_mark: dict[float, float] = {}
    reached: dict[float, tuple[float, int]] = {}
    for i, (t, step, _) in enumerate(rec.points):
        running = statistics.fmean(r for _, _, r in rec.points[max(0, i - 9) : i + 1])
        for m in marks:
            if t >= m and m not in at_mark:
                at_mark[m] = running
        for level in (0.5, 0.8, 0.9):
            if running >= level and level not in reached:
                reached[level] = (t, step)
    first = [r for _, _, r in rec.points[:10]]
    last_t, last_step = (rec.points[-1][0], rec.points[-1][1]) if rec.points else (1.0, 0)
    return {
        "at_mark": at_mark,
        "reached": reached,
        "steps_per_s": last_step / last_t,
        "first10": statistics.fmean(first) if first else float("nan"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="rollout,trainer,learning")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--sizes", default=",".join(SIZES))
    ap.add_argument("--seeds", default="0,1,2", help="learning-curve seeds")
    ap.add_argument("--budget-s", type=float, default=180.0)
    ap.add_argument(
        "--driver",
        choices=["inprocess", "pipeline"],
        default="pipeline",
        help="learning curve: the pipeline (as `train` runs it) or a bare in-process worker+trainer loop",
    )
    ap.add_argument("--steps", type=int, default=None, help="learning: stop after this many steps")
    ap.add_argument("--quick", action="store_true", help="rollout and trainer, smallest model, 1 repeat")
    ap.add_argument("--smoke", action="store_true", help="every part, smallest model, once, 3 learning steps")
    args = ap.parse_args()
    if args.quick:  # a smoke run (make bench): the figures are not the recorded ones
        args.parts, args.repeats, args.new_tokens = "rollout,trainer", 1, 8
        args.sizes = next(iter(SIZES))
    if args.smoke:  # the code paths of the full run at tiny sizes (run_all.py --smoke): figures mean nothing
        args.repeats, args.new_tokens, args.sizes, args.seeds, args.steps = 1, 2, next(iter(SIZES)), "0", 3
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
            marks = [m for m in (10.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0, 180.0) if m <= args.budget_s]
            print(f"\n## demo-cpu learning, driver={args.driver} (running mean reward of the last 10 steps)")
            print(
                f"{'seed':>4} {'steps/s':>7} {'start':>5} "
                + " ".join(f"{'@' + str(int(m)) + 's':>6}" for m in marks)
                + "   time (step) to 0.5 / 0.8 / 0.9"
            )
            for seed in [int(x) for x in args.seeds.split(",")]:
                fn = bench_learning_pipeline if args.driver == "pipeline" else bench_learning
                r = fn(dirs["tiny-88k"], args.budget_s, seed, marks, args.steps)
                cells = [f"{r['at_mark'][m]:6.2f}" if m in r["at_mark"] else f"{'-':>6}" for m in marks]
                hits = [
                    f"{r['reached'][lv][0]:.0f}s ({r['reached'][lv][1]})"
                    if lv in r["reached"]
                    else "not reached"
                    for lv in (0.5, 0.8, 0.9)
                ]
                print(
                    f"{seed:>4} {r['steps_per_s']:7.1f} {r['first10']:5.2f} "
                    + " ".join(cells)
                    + "   "
                    + " / ".join(hits)
                )


if __name__ == "__main__":
    main()
