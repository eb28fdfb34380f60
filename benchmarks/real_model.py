"""A real pretrained model post-trained on this machine: SmolLM2-135M-Instruct on the smollm2-arith-cpu preset.

Three parts, each side by side in one invocation; figures as JSON, the learning curves as a PNG:

- ``learning``: the preset's runs (``python -m rl_engine train``, each in its own process and Ray
  session, one after the other), by backend (``hf``; ``vllm``: vLLM's CPU build, in its environment),
  pipeline mode (``sync``, ``fully_async``) and seed. Each run's held-out pass@1 (greedy, the preset's
  evaluation every few steps) and training reward against the step and the wall clock from the
  pipeline's start (model and Ray start-up excluded, evaluations included).
- ``throughput``: rollout tokens/s of the HF worker and the vLLM worker at the preset's batch (its
  prompts x n, the same prompts for both, responses up to ``max_new_tokens``), alternating A B B A;
  medians. Runs inside the vLLM environment (both workers on the same torch).
- ``export``: a run's last checkpoint exported (``python -m rl_engine export``) and loaded by
  transformers (the HF worker) and by vLLM's CPU build; greedy held-out pass@1 of the exported model
  against the base model, on each.

    .venv/bin/python benchmarks/real_model.py --smoke          # every part's code on a tiny model (CI)
    .venv/bin/python benchmarks/real_model.py --quick          # SmolLM2, a few steps of each part
    .venv/bin/python benchmarks/real_model.py --runs hf:fully_async:0,hf:sync:0 --steps 80 \\
        --parts learning,export --out var/bench/real-model     # the figures in docs/benchmarks.md
    # --reuse reads the runs an earlier invocation finished in --out: add runs one invocation at a time;
    # --reuse --extend --steps N continues a finished run from its last checkpoint to step N

Needs the model (``make model``); the vLLM parts need vLLM's CPU environment (``make check-vllm-cpu``
builds it at ``VLLM_CPU_VENV``, default ``var/venv-vllm-cpu``) and are skipped, saying why, without it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PRESET = "smollm2-arith-cpu"
MODEL_NAME = "smollm2-135m-instruct"
VLLM_VENV = Path(os.environ.get("VLLM_CPU_VENV", ROOT / "var" / "venv-vllm-cpu"))
RUN_TIMEOUT_S = 3 * 3600


@dataclass(frozen=True)
class RunSpec:
    backend: str  # hf | vllm
    mode: str  # sync | fully_async | one_step_off
    seed: int

    @property
    def label(self) -> str:
        return f"{self.backend}-{self.mode}-s{self.seed}"

    @classmethod
    def parse(cls, text: str) -> RunSpec:
        backend, mode, seed = text.split(":")
        return cls(backend, mode, int(seed))


@dataclass
class Curve:
    """One run: per step (reward, wall time) and per evaluation (held-out pass@1, wall time)."""

    label: str
    backend: str
    mode: str
    seed: int
    startup_s: float = 0.0  # process start -> the pipeline's first status event
    steps: list[dict[str, float]] = field(default_factory=list)  # step, wall_s, reward, length
    # step, wall_s, pass_at_1, length; "pass_at_1/<split>" for each extra held-out split
    evals: list[dict[str, float]] = field(default_factory=list)
    checkpoint_dir: str | None = None
    error: str | None = None

    def pass_at(self, minutes: float) -> float | None:
        """Held-out pass@1 of the last evaluation done within ``minutes`` of the pipeline's start."""
        within = [e for e in self.evals if e["wall_s"] <= minutes * 60]
        return within[-1]["pass_at_1"] if within else None

    def summary(self, minutes: float) -> dict[str, Any]:
        first = self.evals[0]["pass_at_1"] if self.evals else None
        last = self.evals[-1] if self.evals else None
        at = self.pass_at(minutes)
        step_s = [s["step_s"] for s in self.steps[2:] if "step_s" in s]
        return {
            "label": self.label,
            "before": first,
            f"at_{minutes:g}_min": at,
            "gain_at_limit": None if first is None or at is None else at - first,
            "last": None if last is None else last["pass_at_1"],
            "last_step": None if last is None else last["step"],
            "last_wall_min": None if last is None else last["wall_s"] / 60,
            "median_step_s": statistics.median(step_s) if step_s else None,
            "last_train_step_wall_min": self.steps[-1]["wall_s"] / 60 if self.steps else None,
            "startup_s": self.startup_s,
            "error": self.error,
            "extra_sets": self.extra_sets(),
        }

    def extra_sets(self) -> dict[str, dict[str, float]]:
        """Each extra held-out split's pass@1: before training, best, last."""
        out: dict[str, dict[str, float]] = {}
        for key in sorted({k for e in self.evals for k in e if k.startswith(SET_PREFIX)}):
            scores = [e[key] for e in self.evals if key in e]
            out[key.removeprefix(SET_PREFIX)] = {"before": scores[0], "best": max(scores), "last": scores[-1]}
        return out


SET_PREFIX = "pass_at_1/"  # an evaluation's pass@1 on an extra held-out split (data.extra_validation_splits)


def extra_set_scores(metrics: dict[str, float]) -> dict[str, float]:
    """``{"pass_at_1/<split>": pass@1}`` for each extra held-out split an evaluation's metrics report
    (``val/<split>/pass@1``)."""
    return {
        f"{SET_PREFIX}{name.split('/')[1]}": value
        for name, value in metrics.items()
        if name.startswith("val/") and name.count("/") == 2 and name.endswith("/pass@1")
    }


def read_curve(spec: RunSpec, metrics_path: Path, started: float) -> Curve:
    """The run's curve from its JSONL log. A run continued with ``--extend`` appends a second process's
    records: its start-up (between the first process's last record and the second's "pipeline running"
    status) is left out of the wall clock, as the first process's is."""
    curve = Curve(spec.label, spec.backend, spec.mode, spec.seed)
    t0: float | None = None
    paused_s, last_time = 0.0, 0.0
    for line in metrics_path.read_text().splitlines():
        item = json.loads(line)
        status = item["message"] if item["type"] == "event" and item.get("kind") == "status" else ""
        running = status.startswith("pipeline running")
        if running and t0 is None:
            t0 = item["time"]
            curve.startup_s = t0 - started
        elif running:  # a continued run: from the first process's last record to this one, start-up
            paused_s += item["time"] - last_time
        if not (running or status.startswith("resumed from")):
            last_time = item["time"]
        if item["type"] != "metrics" or t0 is None:
            continue
        m, wall = item["metrics"], item["time"] - t0 - paused_s
        if "val/pass@1" in m:
            curve.evals.append({"step": item["step"], "wall_s": wall, "pass_at_1": m["val/pass@1"],
                                "length": m.get("val/response_length", 0.0), **extra_set_scores(m)})  # fmt: skip
        if "reward/mean" in m:
            curve.steps.append({"step": item["step"], "wall_s": wall, "reward": m["reward/mean"],
                                "length": m.get("response_length/mean", 0.0),
                                "step_s": m.get("timing/step_s", 0.0)})  # fmt: skip
    return curve


def engine_python(backend: str) -> tuple[str, dict[str, str]]:
    """The interpreter a backend's run uses, and its environment."""
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled", PYTHONUNBUFFERED="1")
    if backend == "vllm":
        env["LD_PRELOAD"] = str(VLLM_VENV / "lib" / "libiomp5.so")
        return str(VLLM_VENV / "bin" / "python"), env
    return sys.executable, env


def vllm_missing() -> str | None:
    python = VLLM_VENV / "bin" / "python"
    if not python.exists():
        return f"no vLLM CPU environment at {VLLM_VENV} (make check-vllm-cpu builds it)"
    return None


def run_overrides(args: argparse.Namespace, spec: RunSpec, data_dir: Path) -> list[str]:
    from rl_engine.presets import get_preset

    # a preset that reads a dataset folder gets the one generated for the invocation (reasoning-gym
    # presets generate their prompts from the config alone)
    data_path = [f"data.path={data_dir}"] if "path" in get_preset(args.preset).get("data", {}) else []
    sets = [
        f"model.path={args.model}",
        *data_path,
        f"pipeline.mode={spec.mode}",
        f"seed={spec.seed}",
        f"trainer.total_steps={args.steps}",
        f"trainer.checkpoint_every={args.steps}",
        "logging.sinks=[jsonl]",
        "logging.log_every=1",
        "logging.samples_per_step=0",
    ]
    if spec.backend == "vllm":
        sets.append(
            "rollout={backend: vllm, device: cpu, n: 8, temperature: 0.7, max_new_tokens: 64, "
            "max_prompt_tokens: 128, enforce_eager: true, cpu_kvcache_space_gb: 1.0, max_num_seqs: 64, "
            "startup_timeout_s: 900}"
        )
    return sets + list(args.set)


def run_learning(args: argparse.Namespace, specs: list[RunSpec], out: Path) -> list[Curve]:
    curves = []
    data_dir = out / "data"  # generated once (the preset's synthetic spec), shared by every run
    for spec in specs:
        if spec.backend == "vllm" and (why := vllm_missing()):
            print(f"skip {spec.label}: {why}", flush=True)
            continue
        run_dir = out / "runs" / spec.label
        if args.reuse and (run_dir / "run.json").exists():  # a finished run of an earlier invocation
            done = json.loads((run_dir / "run.json").read_text())
            from rl_engine.pipeline.checkpoint import list_checkpoints

            last = (list_checkpoints(run_dir / "checkpoints") or [None])[-1]
            if args.extend and done["returncode"] == 0 and last is not None and last[0] < args.steps:
                print(f"run {spec.label}: from step {last[0]} to {args.steps}", flush=True)
                done["returncode"] = train(args, spec, run_dir, data_dir, resume_from=last[1])
                (run_dir / "run.json").write_text(json.dumps(done))
            curves.append(finished_curve(args, spec, run_dir, done["started"], done["returncode"]))
            continue
        shutil.rmtree(run_dir, ignore_errors=True)
        run_dir.mkdir(parents=True)
        print(f"run {spec.label}: {args.steps} steps", flush=True)
        started = time.time()
        rc = train(args, spec, run_dir, data_dir)
        (run_dir / "run.json").write_text(json.dumps({"started": started, "returncode": rc}))
        curves.append(finished_curve(args, spec, run_dir, started, rc))
    return curves


def train(
    args: argparse.Namespace, spec: RunSpec, run_dir: Path, data_dir: Path, resume_from: Path | None = None
) -> int:
    """``python -m rl_engine train`` of one run in its own process (its log appended to engine.log)."""
    python, env = engine_python(spec.backend)
    cmd = [python, "-m", "rl_engine", "train", "--config", f"preset:{args.preset}", "--run-dir", str(run_dir),
           "--checkpoint-dir", str(run_dir / "checkpoints"), "--no-progress-bar"]  # fmt: skip
    if resume_from is not None:  # the checkpoint's step was evaluated at the first process's end
        cmd += ["--resume-from", str(resume_from), "--set", "eval.before_training=false"]
    for s in run_overrides(args, spec, data_dir):
        cmd += ["--set", s]
    with (run_dir / "engine.log").open("a") as log:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                              timeout=RUN_TIMEOUT_S, check=False)  # fmt: skip
    return proc.returncode


def finished_curve(args: argparse.Namespace, spec: RunSpec, run_dir: Path, started: float, rc: int) -> Curve:
    """A finished run's curve from its folder (metrics.jsonl, engine.log), printed in one line."""
    metrics = run_dir / "metrics.jsonl"
    curve = (
        read_curve(spec, metrics, started)
        if metrics.exists()
        else Curve(spec.label, spec.backend, spec.mode, spec.seed)
    )
    curve.checkpoint_dir = str(run_dir / "checkpoints")
    if rc != 0:
        tail = (run_dir / "engine.log").read_text().strip().splitlines()[-1:]
        curve.error = f"exit {rc}: {tail[0] if tail else ''}"
    s = curve.summary(args.minutes)
    print(f"  {spec.label}: pass@1 {s['before']} -> {s['last']} (step {s['last_step']}, "
          f"{(s['last_wall_min'] or 0):.1f} min); {s.get('error') or 'ok'}", flush=True)  # fmt: skip
    return curve


def async_vs_sync(curves: list[Curve]) -> list[dict[str, Any]]:
    """Wall clock to the same trainer step, sync against fully_async, per backend and seed (same data)."""
    out = []
    by_key = {(c.backend, c.mode, c.seed): c for c in curves if c.error is None and c.steps}
    for (backend, mode, seed), sync in by_key.items():
        other = by_key.get((backend, "fully_async", seed))
        if mode != "sync" or other is None:
            continue
        step = min(sync.steps[-1]["step"], other.steps[-1]["step"])
        wall = {c.mode: next(s["wall_s"] for s in c.steps if s["step"] >= step) for c in (sync, other)}
        out.append({"backend": backend, "seed": seed, "step": step, "sync_min": wall["sync"] / 60,
                    "fully_async_min": wall["fully_async"] / 60, "speedup": wall["sync"] / wall["fully_async"]})  # fmt: skip
    return out


def plot(curves: list[Curve], path: Path, minutes: float, title: str) -> str | None:
    """Held-out pass@1 and training reward against wall clock and step, one line per run."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (requirements-dev.txt)"
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    for c in curves:
        if c.evals:
            axes[0][0].plot(
                [e["wall_s"] / 60 for e in c.evals],
                [e["pass_at_1"] for e in c.evals],
                marker="o",
                label=c.label,
            )
            axes[0][1].plot(
                [e["step"] for e in c.evals], [e["pass_at_1"] for e in c.evals], marker="o", label=c.label
            )
        if c.steps:
            smooth = _moving_mean([s["reward"] for s in c.steps], 5)
            axes[1][0].plot([s["wall_s"] / 60 for s in c.steps], smooth, label=c.label)
            axes[1][1].plot([s["step"] for s in c.steps], smooth, label=c.label)
    for ax, (x, y) in zip(axes.flat, [("minutes", "held-out pass@1"), ("trainer step", "held-out pass@1"),
                                      ("minutes", "training reward (mean of 5 steps)"),
                                      ("trainer step", "training reward (mean of 5 steps)")], strict=True):  # fmt: skip
        ax.set_xlabel(x)
        ax.set_ylabel(y)
        ax.grid(alpha=0.3)
    axes[0][0].axvline(minutes, color="grey", ls=":", lw=1)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return None


def _moving_mean(values: list[float], k: int) -> list[float]:
    return [statistics.fmean(values[max(0, i - k + 1) : i + 1]) for i in range(len(values))]


# --- throughput and export: run inside one interpreter per backend ----------------------------------------


def inner_config(args: argparse.Namespace, backend: str, model_path: str, data_dir: Path):
    from rl_engine.config import apply_overrides, parse_config
    from rl_engine.presets import get_preset

    spec = RunSpec(backend, "sync", 0)
    sets = [s for s in run_overrides(args, spec, data_dir) if not s.startswith(("logging.", "trainer."))]
    sets = [s if not s.startswith("model.path=") else f"model.path={model_path}" for s in sets]
    sets.append(f"eval.max_prompts={args.eval_prompts}")
    return parse_config(apply_overrides(get_preset(args.preset), sets))


def inner_throughput(args: argparse.Namespace) -> dict[str, Any]:
    """Tokens/s of the HF and vLLM workers on the same prompts (A B B A ..., medians)."""
    from rl_engine.backends import build_rollout_worker
    from rl_engine.data import PromptStream

    data_dir = Path(args.out) / "data"
    workers, prompts = {}, None
    for backend in ("hf", "vllm"):
        cfg = inner_config(args, backend, args.model, data_dir)
        t = time.monotonic()
        workers[backend] = build_rollout_worker(cfg)
        print(f"{backend} worker ready in {time.monotonic() - t:.1f} s", flush=True)
        if prompts is None:
            stream = PromptStream(cfg, workers[backend].tokenizer)
            prompts = stream.next_batch(cfg.trainer.batch_size // cfg.rollout.n)
            n = cfg.rollout.n
    times: dict[str, list[float]] = {"hf": [], "vllm": []}
    tokens: dict[str, list[int]] = {"hf": [], "vllm": []}
    order = ["hf", "vllm", "vllm", "hf"] * args.repeats
    for backend in ["hf", "vllm", *order]:  # the first call of each is a warm-up, not counted
        t = time.monotonic()
        samples = workers[backend].generate(prompts, n)
        times[backend].append(time.monotonic() - t)
        tokens[backend].append(sum(s.response_length for s in samples))
    out = {}
    for backend in ("hf", "vllm"):
        rates = [k / t for k, t in zip(tokens[backend][1:], times[backend][1:], strict=True)]
        out[backend] = {"tokens_per_s_median": statistics.median(rates), "tokens_per_s": rates,
                        "sequences": len(prompts) * n, "mean_response_tokens": statistics.fmean(tokens[backend][1:]) / (len(prompts) * n)}  # fmt: skip
    out["ratio_vllm_over_hf"] = out["vllm"]["tokens_per_s_median"] / out["hf"]["tokens_per_s_median"]
    return out


def inner_export_eval(args: argparse.Namespace) -> dict[str, Any]:
    """Greedy held-out pass@1 of the base and the exported model with this interpreter's backend."""
    from rl_engine.backends import build_rollout_worker
    from rl_engine.evaluation import Evaluator

    data_dir = Path(args.out) / "data"
    results = {}
    for name, path in (("base", args.model), ("trained", args.exported)):
        cfg = inner_config(args, args.backend, path, data_dir)
        worker = build_rollout_worker(cfg)
        evaluator = Evaluator.from_config(cfg, worker.tokenizer)
        assert evaluator is not None
        result = evaluator.run(worker)
        results[name] = {"pass_at_1": result.summary.pass_at_1, "response_length": result.summary.response_length,
                         "example": result.samples[0].response_text[:200]}  # fmt: skip
        close = getattr(worker, "close", None)
        if close:
            close()
    return results


def run_inner(args: argparse.Namespace, part: str, backend: str, **extra: str) -> dict[str, Any] | str:
    """This script's ``--inner PART`` in the backend's interpreter; its JSON, or why it did not run."""
    if backend == "vllm" and (why := vllm_missing()):
        return why
    python, env = engine_python(backend)
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as fh:
        result_path = fh.name
    cmd = [python, str(Path(__file__).resolve()), "--inner", part, "--backend", backend, "--result", result_path,
           "--out", str(args.out), "--model", str(args.model), "--preset", args.preset,
           "--eval-prompts", str(args.eval_prompts), "--repeats", str(args.repeats)]  # fmt: skip
    for key, value in extra.items():
        cmd += [f"--{key.replace('_', '-')}", value]
    for s in args.set:
        cmd += ["--set", s]
    proc = subprocess.run(
        cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False
    )
    if proc.returncode != 0:
        return f"exit {proc.returncode}: {(proc.stderr.strip().splitlines() or [''])[-1]}"
    result = json.loads(Path(result_path).read_text())
    os.unlink(result_path)
    return result


def export_checkpoint(checkpoint_dir: str, out_dir: Path) -> str | None:
    proc = subprocess.run([sys.executable, "-m", "rl_engine", "export", "--checkpoint", checkpoint_dir,
                           "--out", str(out_dir), "--force"], cwd=ROOT, capture_output=True, text=True, check=False)  # fmt: skip
    return None if proc.returncode == 0 else (proc.stderr.strip().splitlines() or ["export failed"])[-1]


# --- main --------------------------------------------------------------------------------------------------


def smoke_model(out: Path) -> Path:
    """A tiny Llama with a chat template (the gsm8k-style-tiny-cpu preset's), built in ``out``."""
    from rl_engine.config import TinyModelSpec
    from rl_engine.models.tiny import save_tiny_model
    from rl_engine.presets import get_preset

    spec = TinyModelSpec(**get_preset("gsm8k-style-tiny-cpu")["model"]["tiny"])
    return save_tiny_model(spec, out / "tiny-chat-model")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parts", default="learning,throughput,export")
    p.add_argument("--runs", default="hf:sync:0,hf:fully_async:0,vllm:fully_async:0",
                   help="backend:mode:seed, comma-separated")  # fmt: skip
    p.add_argument("--steps", type=int, default=80, help="trainer steps per run")
    p.add_argument("--minutes", type=float, default=60.0, help="report pass@1 at this wall clock")
    p.add_argument("--eval-prompts", type=int, default=64, help="held-out prompts (export part)")
    p.add_argument("--repeats", type=int, default=3, help="throughput repeats (A B B A each)")
    p.add_argument("--set", action="append", default=[], help="a config override for every run (repeatable)")
    p.add_argument("--preset", default=PRESET)
    p.add_argument(
        "--model", default=None, help=f"model directory (default: the first model root's {MODEL_NAME})"
    )
    p.add_argument("--out", default=None, help="folder for runs, JSON and PNG (default: a temporary one)")
    p.add_argument("--reuse", action="store_true",
                   help="read runs an earlier invocation finished in --out instead of running them again")  # fmt: skip
    p.add_argument("--extend", action="store_true",
                   help="with --reuse: continue a finished run from its last checkpoint to --steps")  # fmt: skip
    p.add_argument("--quick", action="store_true", help="SmolLM2, 3 steps per run, hf runs only")
    p.add_argument(
        "--smoke", action="store_true", help="a tiny model, 2 steps per run, hf only: seconds-scale"
    )
    p.add_argument("--inner", choices=["throughput", "export"], help=argparse.SUPPRESS)
    p.add_argument("--backend", default="hf", help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    p.add_argument("--exported", help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.inner:
        result = inner_throughput(args) if args.inner == "throughput" else inner_export_eval(args)
        Path(args.result).write_text(json.dumps(result))
        return 0

    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="real_model_"))
    out.mkdir(parents=True, exist_ok=True)
    args.out = out
    parts = set(args.parts.split(","))
    specs = [RunSpec.parse(r) for r in args.runs.split(",") if r]
    if args.smoke:
        args.model = str(smoke_model(out))
        args.preset = "gsm8k-style-tiny-cpu"
        args.steps, args.eval_prompts, args.repeats = 2, 8, 1
        args.set = ["data.synthetic.train_size=64", "data.synthetic.test_size=8", "trainer.batch_size=16",
                    "trainer.mini_batch_size=16", "eval.every=1", *args.set]  # fmt: skip
        specs = [RunSpec("hf", "fully_async", 0)]
        parts -= {"throughput"}
    elif args.quick:
        args.steps, args.eval_prompts, args.repeats = 3, 16, 1
        args.set = ["eval.every=3", "eval.max_prompts=16", *args.set]
        specs = [s for s in specs if s.backend == "hf"] or [RunSpec("hf", "fully_async", 0)]
    if args.model is None:
        from rl_engine.cli import default_model_root

        args.model = str((default_model_root() / MODEL_NAME).resolve())
    if not (Path(args.model) / "config.json").exists():
        print(f"error: no model at {args.model}: make model (or --model DIR)", file=sys.stderr)
        return 1

    report: dict[str, Any] = {"preset": args.preset, "model": args.model, "steps": args.steps,
                              "minutes": args.minutes, "overrides": args.set}  # fmt: skip
    curves: list[Curve] = []
    if "learning" in parts:
        curves = run_learning(args, specs, out)
        report["runs"] = [c.summary(args.minutes) for c in curves]
        report["curves"] = [asdict(c) for c in curves]
        report["async_vs_sync"] = async_vs_sync(curves)
        title = f"{Path(args.model).name}, preset {args.preset}, {os.cpu_count()} CPU cores"
        why = plot(curves, out / "curves.png", args.minutes, title)
        report["png"] = None if why else str(out / "curves.png")
        if why:
            print(f"no PNG: {why}")
    if "throughput" in parts:
        report["throughput"] = run_inner(args, "throughput", "vllm")
        print(f"throughput: {json.dumps(report['throughput'])[:400]}", flush=True)
    if "export" in parts:
        trained = next((c for c in curves if c.error is None and c.checkpoint_dir), None)
        if trained is None:
            report["export"] = "no successful run to export (the export part follows the learning part)"
        else:
            exported = out / "exported"
            why = export_checkpoint(trained.checkpoint_dir, exported)
            report["export"] = {"from": trained.label, "dir": str(exported)} if why is None else why
            if why is None:
                backends = ["hf"] if args.smoke else ["hf", "vllm"]
                for backend in backends:
                    report["export"][backend] = run_inner(args, "export", backend, exported=str(exported))
        print(f"export: {json.dumps(report['export'])[:600]}", flush=True)
    (out / "report.json").write_text(json.dumps(report, indent=2))
    print(json.dumps({k: v for k, v in report.items() if k != "curves"}, indent=2))
    print(f"figures: {out / 'report.json'}")
    failed = [c.label for c in curves if c.error]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
