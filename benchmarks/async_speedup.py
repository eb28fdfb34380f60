"""Async speedup benchmark: (a) long-tail simulation, (b) real tiny model on CPU, (c) weight sync.

One invocation prints one table (and ``--json PATH`` writes the raw figures)::

    .venv/bin/python benchmarks/async_speedup.py            # all three parts
    .venv/bin/python benchmarks/async_speedup.py --parts a  # only the simulation
    .venv/bin/python benchmarks/async_speedup.py --quick    # parts a and c, small (``make bench``)
    .venv/bin/python benchmarks/async_speedup.py --smoke    # every part, a few steps once: a check that it runs

(a) The real pipeline (actors, queue, admission gate, weight sync, partial rollout) with a rollout
    worker and trainer whose *costs* come from the seeded model in ``harness.simulated``:
    D devices of S decode slots; ``sync`` time-shares all D devices (generate a batch of D*S
    sequences on D*S slots, then train on D devices); the async modes split them, D_r rollout
    devices (one rollouter each) and D_t = D - D_r training devices. See docs/pipeline.md for the
    bound: throughput <= 1 / max(gen stage time, train stage time) per batch.
(b) The demo-cpu preset on the tiny model, ``sync`` vs ``fully_async`` at equal trained samples, each
    actor pinned to one torch thread (2 cores: one for the rollouter, one for the trainer).
(c) One pipeline weight sync (trainer publish + rollouter load through the object store) vs a bare
    ``ray.put`` + ``ray.get`` + ``load_state_dict`` of the same numpy state dict between two actors.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import numpy as np  # noqa: E402
import ray  # noqa: E402

from harness.simulated import response_length  # noqa: E402
from rl_engine.config import apply_overrides, parse_config  # noqa: E402
from rl_engine.pipeline import run_experiment  # noqa: E402
from rl_engine.pipeline.components import Components, Factory  # noqa: E402
from rl_engine.presets import get_preset  # noqa: E402
from rl_engine.sinks import MetricsSink  # noqa: E402


class StepClock(MetricsSink):
    """Sink keeping per-step wall times and rewards (the pipeline's ``timing/step_s``); events and samples
    are ignored (the base class's no-ops)."""

    def __init__(self) -> None:
        self.steps: list[tuple[int, dict[str, float]]] = []

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        self.steps.append((step, metrics))

    def steady_throughput(self, batch: int, skip: int = 2) -> float:
        """Samples per second over the steps after the first ``skip`` (start-up excluded)."""
        walls = [m["timing/step_s"] for _, m in self.steps[skip:]]
        return batch * len(walls) / sum(walls)


# --- (a) long-tail simulation -------------------------------------------------------------------------
SIM = {
    "devices": 4,
    "slots": 16,
    "n": 8,
    "len_median": 32,
    "len_sigma": 0.99,
    "len_cap": 512,
    "decode_step_s": 0.004,
    "train_token_s": 0.00032,
    "chunk_steps": 8,
    "seed": 0,
    "staleness": 2,
    "trigger": 2,
    "prompts_per_call": 2,
    "rollout_concurrency": 4,
}


def sim_model_figures(p: dict[str, Any], rollout_devices: int, samples: int = 20000) -> dict[str, float]:
    """Analytic stage times per batch (seconds) from the same seeded length model the worker uses."""
    lens = np.array(
        [
            response_length(p["seed"], i // p["n"], i % p["n"], p["len_median"], p["len_sigma"], p["len_cap"])
            for i in range(samples)
        ]
    )
    batch = p["devices"] * p["slots"]
    maxes = lens[: samples // batch * batch].reshape(-1, batch).max(axis=1)
    chunk = p["chunk_steps"]
    sync_gen = float(np.mean(np.ceil(maxes / chunk) * chunk)) * p["decode_step_s"]
    tokens = batch * float(lens.mean())
    d_t = p["devices"] - rollout_devices
    return {
        "p50": float(np.median(lens)),
        "p99": float(np.percentile(lens, 99)),
        "mean_len": float(lens.mean()),
        "sync_step_s": sync_gen + tokens * p["train_token_s"] / p["devices"],
        "gen_stage_s": tokens * p["decode_step_s"] / (rollout_devices * p["slots"]),
        "train_stage_s": tokens * p["train_token_s"] / d_t,
    }


def run_sim(mode: str, p: dict[str, Any], rollout_devices: int, steps: int) -> StepClock:
    batch = p["devices"] * p["slots"]
    async_mode = mode != "sync"
    worker = {
        "slots": p["slots"] if async_mode else batch,
        "decode_step_s": p["decode_step_s"],
        "chunk_steps": p["chunk_steps"],
        "len_median": p["len_median"],
        "len_sigma": p["len_sigma"],
        "len_cap": p["len_cap"],
    }
    trainer = {
        "train_token_s": p["train_token_s"],
        "devices": p["devices"] - rollout_devices if async_mode else p["devices"],
        "weight_mb": 4.0,
    }
    comps = Components(
        worker=Factory("harness.simulated:sim_worker", worker),
        prompts=Factory("harness.simulated:sim_prompts"),
        reward=Factory("harness.simulated:sim_reward"),
        trainer=Factory("harness.simulated:sim_trainer", trainer),
        prepare=None,
    )
    cfg = parse_config(
        {
            "name": f"sim-{mode}",
            "seed": p["seed"],
            "model": {"path": "/nonexistent"},
            "rollout": {"backend": "hf", "n": p["n"], "max_new_tokens": p["len_cap"]},
            "trainer": {"total_steps": steps, "batch_size": batch, "mini_batch_size": batch},
            "pipeline": {
                "mode": mode,
                "staleness_threshold": p["staleness"],
                "trigger_parameter_sync_step": p["trigger"],
                "partial_rollout": True,
                "num_rollouters": rollout_devices if async_mode else 1,
                "prompts_per_call": p["prompts_per_call"] if async_mode else 0,
                "rollout_concurrency": p["rollout_concurrency"] if async_mode else 1,
            },
            "resources": {"cpus_per_actor": 0.01},
            "logging": {"sinks": [], "samples_per_step": 0},
        }
    )
    clock = StepClock()
    run_experiment(cfg, clock, components=comps)
    return clock


def part_a(steps: int, repeats: int) -> dict[str, Any]:
    p = SIM
    best = min(
        range(1, p["devices"]),
        key=lambda r: max(sim_model_figures(p, r)["gen_stage_s"], sim_model_figures(p, r)["train_stage_s"]),
    )
    fig = sim_model_figures(p, best)
    batch = p["devices"] * p["slots"]
    bound = batch / max(fig["gen_stage_s"], fig["train_stage_s"])
    out: dict[str, Any] = {
        "params": p,
        "rollout_devices": best,
        "model": fig,
        "bound_samples_per_s": bound,
        "sync_analytic_samples_per_s": batch / fig["sync_step_s"],
        "modes": {},
    }
    for mode in ("sync", "one_step_off", "fully_async"):
        clocks = [run_sim(mode, p, best, steps) for _ in range(repeats)]
        tps = [c.steady_throughput(batch) for c in clocks]
        last = clocks[-1].steps[2:]
        out["modes"][mode] = {
            "samples_per_s": statistics.median(tps),
            "runs": tps,
            "trainer_idle": statistics.fmean(m["trainer/idle_ratio"] for _, m in last),
            "rollouter_idle": statistics.fmean(m["rollouter/idle_ratio"] for _, m in last),
            "partial_ratio": statistics.fmean(m["async/partial_ratio"] for _, m in last),
            "staleness_mean": statistics.fmean(m["async/staleness_mean"] for _, m in last),
        }
    return out


# --- (b) real tiny model --------------------------------------------------------------------------------
def run_real(mode: str, steps: int, model_dir: Path) -> tuple[StepClock, float]:
    data = get_preset("demo-cpu")
    data["model"]["path"] = str(model_dir)
    cfg = parse_config(
        apply_overrides(
            data,
            [
                f"pipeline.mode={mode}",
                "pipeline.staleness_threshold=1",
                f"trainer.total_steps={steps}",
                "logging.sinks=[]",
                "logging.samples_per_step=0",
                "logging.log_every=1",
                "rollout.num_threads=1",
                "trainer.num_threads=1",
            ],
        )
    )
    clock = StepClock()
    summary = run_experiment(cfg, clock)
    return clock, float(summary.final_reward_mean or 0.0)


def part_b(steps: int, repeats: int) -> dict[str, Any]:
    """Alternate the modes ``repeats`` times (the machine is shared: medians, not single runs)."""
    tmp = Path(tempfile.mkdtemp(prefix="bench_model_"))
    runs: dict[str, list[dict[str, float]]] = {"sync": [], "fully_async": []}
    try:
        for _ in range(repeats):
            for mode in runs:
                clock, reward = run_real(mode, steps, tmp / "tiny")
                walls = [m["timing/step_s"] for _, m in clock.steps[1:]]
                runs[mode].append(
                    {
                        "train_wall_s": sum(walls),
                        "final_reward": reward,
                        "staleness_mean": statistics.fmean(m["async/staleness_mean"] for _, m in clock.steps),
                    }
                )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out: dict[str, Any] = {"steps": steps, "repeats": repeats, "modes": {}}
    for mode, rs in runs.items():
        out["modes"][mode] = {k: statistics.median(r[k] for r in rs) for k in rs[0]} | {"runs": rs}
    out["speedups"] = [
        s["train_wall_s"] / f["train_wall_s"] for s, f in zip(runs["sync"], runs["fully_async"], strict=True)
    ]
    return out


# --- (c) weight sync ----------------------------------------------------------------------------------------
def part_c(repeats: int) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from _sync_bench import measure_sync

    return measure_sync(repeats)


def _table(res: dict[str, Any]) -> str:
    rows = ["| part | configuration | figure | ratio |", "|---|---|---|---|"]
    if "a" in res:
        a = res["a"]
        sync = a["modes"]["sync"]["samples_per_s"]
        rows.append(
            f"| (a) sim | sync (analytic) | {a['sync_analytic_samples_per_s']:.1f} samples/s | "
            f"{a['sync_analytic_samples_per_s'] / sync:.2f}x measured sync |"
        )
        rows.append(
            f"| (a) sim | bound (analytic, D_r={a['rollout_devices']}) | "
            f"{a['bound_samples_per_s']:.1f} samples/s | {a['bound_samples_per_s'] / sync:.2f}x sync |"
        )
        for mode, v in a["modes"].items():
            rows.append(
                f"| (a) sim | {mode} (trainer idle {v['trainer_idle']:.0%}, rollouter idle "
                f"{v['rollouter_idle']:.0%}, staleness {v['staleness_mean']:.2f}) | "
                f"{v['samples_per_s']:.1f} samples/s | {v['samples_per_s'] / sync:.2f}x "
                f"sync, {v['samples_per_s'] / a['bound_samples_per_s']:.0%} of bound |"
            )
    if "b" in res:
        b = res["b"]["modes"]
        for mode, v in b.items():
            rows.append(
                f"| (b) tiny model | {mode} (staleness {v['staleness_mean']:.2f}) | "
                f"{v['train_wall_s']:.1f} s for {res['b']['steps'] - 1} steps (median), "
                f"final reward {v['final_reward']:.3f} | "
                f"{b['sync']['train_wall_s'] / v['train_wall_s']:.2f}x |"
            )
        rows.append(
            f"| (b) tiny model | per-pair speedups | "
            f"{', '.join(f'{x:.2f}x' for x in res['b']['speedups'])} | |"
        )
    if "c" in res:
        c = res["c"]
        rows.append(
            f"| (c) weight sync | {c['mb']:.1f} MB state dict | pipeline {c['pipeline_s'] * 1e3:.1f} ms vs "
            f"bare {c['bare_s'] * 1e3:.1f} ms (medians) | {c['pipeline_s'] / c['bare_s']:.2f}x bare |"
        )
        rows.append(
            f"| (c) weight sync, gloo | same, `pipeline.sync_backend: gloo` | {c['gloo_s'] * 1e3:.1f} ms "
            f"(median) | {c['gloo_s'] / c['bare_s']:.2f}x bare |"
        )
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="abc")
    ap.add_argument("--sim-steps", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--real-steps", type=int, default=200)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--quick", action="store_true", help="parts a and c, 8 steps, 1 repeat: a minute or two")
    ap.add_argument(
        "--smoke", action="store_true", help="every part, 4 steps (b: 3), 1 sync: a check that it runs"
    )
    args = ap.parse_args()
    if args.quick:  # a smoke run (make bench): the figures are not the recorded ones
        args.parts, args.sim_steps, args.repeats = "ac", 8, 1
    if args.smoke:  # the code paths of the full run at tiny sizes (run_all.py --smoke): figures mean nothing
        args.sim_steps, args.repeats, args.real_steps = 4, 1, 3
    tmp = tempfile.mkdtemp(prefix="rlb_", dir="/tmp")
    ray.init(num_cpus=16, include_dashboard=False, _temp_dir=tmp, log_to_driver=False)
    res: dict[str, Any] = {}
    t0 = time.time()
    try:
        if "a" in args.parts:
            res["a"] = part_a(args.sim_steps, args.repeats)
        if "b" in args.parts:
            res["b"] = part_b(args.real_steps, args.repeats)
        if "c" in args.parts:
            res["c"] = part_c(1 if args.smoke else max(5, args.repeats * 5))
    finally:
        ray.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
    print(
        f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; took {time.time() - t0:.0f} s"
    )
    print(_table(res))
    if args.json:
        args.json.write_text(json.dumps(res, indent=2, default=float))


if __name__ == "__main__":
    main()
